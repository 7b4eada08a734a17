// Token embedding: the gather and its deterministic gradient. Twin of
// rusting_brain_core::ops::embedding. Ids are checked on the host before launch.
#include "common.cuh"

// out[r] = table[ids[r]]: one thread per output element, grid-stride.
extern "C" __global__ void embedding_forward(float* out, const float* table, const unsigned int* ids,
                                             int rows, int dim) {
    const long long n = (long long)rows * dim;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / dim;
        const int c = (int)(i % dim);
        out[i] = table[(long long)ids[r] * dim + c];
    }
}
RB_EXPORT(embedding_forward)

// dtable[ids[r]] += dout[r] for every position r, with the rows grouped by id on the
// host: uniq[u] is an id, its rows are
// positions[offsets[u] .. offsets[u + 1]] in increasing order. One thread per (id, column)
// adds that id's rows in order, then into the table: deterministic, and parallel over
// every id and column instead of walking all rows per column.
extern "C" __global__ void embedding_backward(float* dtable, const float* dout,
                                              const unsigned int* uniq,
                                              const unsigned int* offsets,
                                              const unsigned int* positions, int n_uniq,
                                              int dim) {
    const long long n = (long long)n_uniq * dim;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long u = i / dim;
        const int c = (int)(i % dim);
        float s = 0.0f;
        for (unsigned int p = offsets[u]; p < offsets[u + 1]; p++)
            s += dout[(long long)positions[p] * dim + c];
        dtable[(long long)uniq[u] * dim + c] += s;
    }
}
RB_EXPORT(embedding_backward)
