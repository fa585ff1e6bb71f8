"""Built-in kernel machinery that op families use: the torch.compile variant of an op
(``compiled``), numcheck's own Triton kernels (``triton_builtin``) and the exact float
conversions its interpreter needs on the CPU (``triton_interp``), the compiled textbook GEMM
loop (``gemm_cpu``), how numcheck calls a kernel (``calls``), and ``adapt`` (``nc.adapt``: a library's entry point as a kernel of an op).
Registers nothing and imports no op family."""
