"""Parameter partitions of the follow-up paper (§3.3), written as layer-swap recipe keys.

Each partition says which side (language or task/math) owns which layers and components; the
same data drives merging (`layer_swap` with `partition: A`) and, later, freezing during training.
"""

from typing import Literal

PartitionName = Literal["A", "B", "C"]

# Values are LayerSwapRecipe fields: a whole side for a component, or zones of its own.
PARTITIONS: dict[str, dict] = {
    # All attention -> language; MLP of the first 6 and last 2 layers -> language, rest -> math.
    "A": {"attention": "language", "mlp": {"bottom": 6, "top": 2}, "bottom": 6, "top": 2},
    # First 8 and last 4 layers -> language, rest -> math.
    "B": {"bottom": 8, "top": 4},
    # First 6 and last 2 layers -> language, rest -> math.
    "C": {"bottom": 6, "top": 2},
}
