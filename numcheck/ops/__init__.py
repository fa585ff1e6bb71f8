"""Op families, one file each: an op's input builder, FP64 reference from primitives, careful
same-precision baseline (fp32 inside, rounded at the op's outputs: DESIGN rule 4), case grid
and policy, and its built-in kernels, declared as data (``OPS``, ``KERNELS``).
``numcheck.catalog`` registers them; importing a family registers nothing. Quantization paths
are ops too (``quant``)."""
