"""Code generation for the package's target: TVM targets, ahead-of-time device code, checks.

A CUDA package must carry machine code (SASS) for its GPU and nothing that needs a compiler
where it runs. TVM 0.27 by default keeps CUDA *source* in the library when the build machine
has no driver, and compiles it when the library is loaded; the modules here make the build
ahead-of-time on any machine and verify the result:

* `targets`: our declarative targets (`runtime/targets/*.toml`) -> `tvm.target.Target`;
* `toolchain`: loads TVM's CUDA codegen on a driverless machine (stub `libcuda.so.1`), routes
  device compilation to nvcc for exactly the target arch, and caches the compiled kernels;
* `export`: writes the library, cross-linking the host code for AArch64 targets;
* `graphs`: the CUDA-graph variant of decode (one captured graph per batch bucket);
* `fatbin`: reads the device code embedded in a library (entries, architectures, any source)
  without TVM or the CUDA toolkit, so the same check runs in CI and on the GPU machine.

Kernel providers (ours in `ninfer_compiler.ops`, dlight schedules in `passes.pipeline`) are
chosen by the target kind while the model is traced; see `ops.common.kernel_flavor`.
"""
