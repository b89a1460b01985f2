"""The GPU bandwidth probe's kernel, in a module of its own so that `numba.cuda`
(which picks the simulator or the driver when first imported) is imported
only when a CUDA measurement is asked for."""

from numba import cuda


@cuda.jit
def triad(a, b, c, scalar):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, a.shape[0], stride):
        a[i] = b[i] + scalar * c[i]
