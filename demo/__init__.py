"""`layerswap demo`: the whole pipeline on the embedded world (`pipeline.py`: build, train two
experts, score indicators, search, promote) and the seconds-long merge-only demo on a tiny model
family (`merge_only.py`). The same library code as a real study, with the world's configs."""
