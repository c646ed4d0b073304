/* What one CUDA graph launch per decode step costs at the step boundary, against several steps in one graph.
 *
 * A "step" here is a chain of KERNELS kernels of 528 blocks (4 per SM on an H200, as the split-K attention runs),
 * each waiting on its predecessor by programmatic dependent launch (PDL) and then spinning SPIN_NS on the global
 * timer, as kite's decode kernels chain. The step runs as
 *   1 step per graph, graphs launched back to back (kite's decode today, without the step copy),
 *   1 step per graph with a small host-to-device copy before each launch (kite's step buffer, forward_decode),
 *   k = 2, 4, 8 steps per graph (the boundary between steps inside the graph is a PDL hand-over like any other).
 * The difference in time per step between the forms is what a graph boundary costs beyond an in-graph hand-over:
 * the most a multi-step decode graph could save per token.
 *
 * Build (here or on the GPU machine):
 *   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o graph_boundary bench/experiments/2026-12-01-graph-boundary.cu
 * Run: ./graph_boundary [spin_ns [kernels [small_ends]]]   (defaults 2000, 8 and 0; small_ends 1: the step's first and
 * last kernels are one block each)
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                                               \
    do {                                                                                                          \
        cudaError_t e_ = (call);                                                                                  \
        if (e_ != cudaSuccess) {                                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));               \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

static __device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Waits for the kernel before it (PDL), lets the next one launch, then spins: a stand-in for a decode kernel. */
__global__ void spin_kernel(unsigned spin_ns, int *sink) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    const unsigned long long start = global_ns();
    while (global_ns() - start < spin_ns) {
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1); /* the work is not optimised away */
}

/* small_ends: the step's first and last kernels are one block (as kite's embedding, argmax and publish are). */
static bool small_ends = false;

static void launch_step(cudaStream_t s, int kernels, unsigned spin_ns, int *sink, int blocks) {
    for (int k = 0; k < kernels; k++) {
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(small_ends && (k == 0 || k == kernels - 1) ? 1 : blocks);
        config.blockDim = dim3(128);
        config.stream = s;
        cudaLaunchAttribute attribute[1];
        attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[0].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = attribute;
        config.numAttrs = 1;
        CHECK(cudaLaunchKernelEx(&config, spin_kernel, spin_ns, sink));
    }
}

static cudaGraphExec_t capture(cudaStream_t s, int steps, int kernels, unsigned spin_ns, int *sink, int blocks) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < steps; i++) launch_step(s, kernels, spin_ns, sink, blocks);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));
    return exec;
}

static int compare_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Microseconds per step, median of 5 runs of total_steps steps (a warm-up run first). */
static float time_form(cudaStream_t s, cudaGraphExec_t exec, int steps_per_graph, int total_steps, bool copy,
                       int *step_device, int *step_host, cudaEvent_t copied) {
    cudaEvent_t begin, end;
    CHECK(cudaEventCreate(&begin));
    CHECK(cudaEventCreate(&end));
    float runs[6];
    for (int r = 0; r < 6; r++) {
        CHECK(cudaEventRecord(begin, s));
        for (int i = 0; i < total_steps / steps_per_graph; i++) {
            if (copy) { /* as forward_decode: wait for the last copy to have left the host buffer, refill, copy */
                CHECK(cudaEventSynchronize(copied));
                for (int j = 0; j < 16; j++) step_host[j] = i + j;
                CHECK(cudaMemcpyAsync(step_device, step_host, 16 * sizeof(int), cudaMemcpyHostToDevice, s));
                CHECK(cudaEventRecord(copied, s));
            }
            CHECK(cudaGraphLaunch(exec, s));
        }
        CHECK(cudaEventRecord(end, s));
        CHECK(cudaEventSynchronize(end));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, begin, end));
        runs[r] = ms * 1000.0f / (float)total_steps;
    }
    qsort(runs + 1, 5, sizeof(float), compare_float); /* runs[0] is the warm-up */
    CHECK(cudaEventDestroy(begin));
    CHECK(cudaEventDestroy(end));
    return runs[3];
}

int main(int argc, char **argv) {
    const unsigned spin_ns = argc > 1 ? (unsigned)atoi(argv[1]) : 2000u;
    const int kernels = argc > 2 ? atoi(argv[2]) : 8;
    small_ends = argc > 3 && atoi(argv[3]) != 0;
    if (kernels < 1 || kernels > 1000) {
        fprintf(stderr, "kernels must be 1..1000\n");
        return 2;
    }
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int blocks = 4 * sms;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *sink, *step_device, *step_host;
    CHECK(cudaMalloc(&sink, sizeof(int)));
    CHECK(cudaMalloc(&step_device, 16 * sizeof(int)));
    CHECK(cudaMallocHost(&step_host, 16 * sizeof(int)));
    cudaEvent_t copied;
    CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    CHECK(cudaEventRecord(copied, s));
    const int total_steps = 2048;
    printf("# %d kernels per step of %d blocks%s, each spinning %u ns after its PDL wait; us per step, median of 5\n",
           kernels, blocks, small_ends ? " (the first and last: 1 block)" : "", spin_ns);
    const int forms[] = {1, 2, 4, 8};
    float one = 0.0f;
    for (int f = 0; f < 4; f++) {
        cudaGraphExec_t exec = capture(s, forms[f], kernels, spin_ns, sink, blocks);
        const float us = time_form(s, exec, forms[f], total_steps, false, step_device, step_host, copied);
        if (f == 0) one = us;
        printf("%d step(s) per graph:             %8.3f us per step (%+.3f against one)\n", forms[f], us, us - one);
        if (f == 0) {
            const float with_copy = time_form(s, exec, 1, total_steps, true, step_device, step_host, copied);
            printf("1 step per graph + step copy:     %8.3f us per step (%+.3f against one)\n", with_copy,
                   with_copy - one);
        }
        CHECK(cudaGraphExecDestroy(exec));
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(sink));
    CHECK(cudaFree(step_device));
    CHECK(cudaFreeHost(step_host));
    CHECK(cudaEventDestroy(copied));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
