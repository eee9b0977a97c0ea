"""Our own kernels (TE and TIR), called from `relax.frontend.nn` models.

Every function here takes and returns `nn.Tensor`s and emits one `call_tir` (or
`call_tir_inplace`) per call. Hand-written TIR kernels carry `tirx.is_scheduled` so
target schedulers leave them alone; TE ops are left to the pipeline's schedules.
The cache tensors (KV pool, GDN recurrent and conv state) are plain tensors owned by
the runtime and updated in place by these kernels.
"""
