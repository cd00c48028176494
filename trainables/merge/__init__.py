"""The merge engine: recipes applied to checkpoints, streamed to disk or composed in memory.

Entry points: `api.merge(recipe, out)` (LoRA adapters or full weights; `layerswap merge`) and
`api.export_mergekit(recipe)`. Rooms: `arch` (parameter name -> layer, component), `checkpoint`
(safetensors in byte ranges), `methods` (the merge-method table), `terms` + `assembly` (recipe
-> per-tensor assembly, pure), `ops` (the tensor arithmetic), `engine` (the disk merge), `compose`
(the same assembly in memory), `live` (experts in memory and the live model the search re-points),
`lora` (PEFT adapter swaps), `mergekit_export`, `modelcard`.
"""
