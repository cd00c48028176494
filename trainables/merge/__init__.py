"""The merge engine: recipes applied to checkpoints, streamed to disk or composed in memory.

Rooms: `arch` (parameter name -> layer, component), `checkpoint` (safetensors in byte ranges),
`plan` (recipe -> per-tensor plan, pure), `ops` (the tensor arithmetic), `engine` (the disk
merge behind `layerswap merge`), `compose` (the same plan in memory), `lora` (PEFT adapter
swaps), `mergekit_export`, `modelcard`.
"""
