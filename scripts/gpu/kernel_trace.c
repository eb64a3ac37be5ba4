/*
 * kernel_trace.c — a timeline of every kernel a CUDA program runs, for
 * the device machine, which has no Nsight Systems. Built as a shared
 * library and named by CUDA_INJECTION64_PATH, it is loaded by the CUDA
 * driver itself at cuInit, before the program makes a context, so the
 * program runs unchanged (scripts/gpu/run.sh `trace` builds and uses it).
 *
 * It asks CUPTI's activity API for concurrent-kernel records (kernels are
 * not serialized for it; dependent launches keep overlapping) and writes
 * one CSV line per kernel run inside a CUDA graph — the replayed decode
 * steps — to KERNEL_TRACE_OUT (default kernel_trace.csv):
 *
 *   graph,node,start_ns,end_ns,blocks,threads,name
 *
 * `start_ns` is when the kernel's first block began (under a dependent
 * launch, before its wait for the kernel ahead), `end_ns` when its last
 * block ended, both on the GPU's clock. Kernels outside graphs (prefill,
 * one-off launches) are counted, not written. At exit it prints, on
 * stderr, how many records it wrote, skipped and lost (CUPTI drops
 * records when its buffers fill faster than they are handed back).
 * scripts/gpu/trace_report.py turns the file into each launch's cost in
 * the chain.
 */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define BUFFER_BYTES (16u << 20)

static FILE* trace_out;
static unsigned long long written, outside_graphs, dropped;

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size,
                                      size_t valid) {
    CUpti_Activity* record = NULL;
    (void)size;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
            record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)record;
        if (k->graphId == 0) {
            outside_graphs++;
            continue;
        }
        if (trace_out) {
            fprintf(trace_out, "%u,%llu,%llu,%llu,%lld,%d,%s\n", k->graphId,
                    (unsigned long long)k->graphNodeId, (unsigned long long)k->start,
                    (unsigned long long)k->end, (long long)k->gridX * k->gridY * k->gridZ,
                    k->blockX * k->blockY * k->blockZ, k->name ? k->name : "?");
            written++;
        }
    }
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &lost) == CUPTI_SUCCESS) dropped += lost;
    free(buffer);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    if (trace_out) fclose(trace_out);
    trace_out = NULL;
    fprintf(stderr,
            "kernel_trace: %llu kernels in graphs written, %llu outside graphs skipped, "
            "%llu records lost\n",
            written, outside_graphs, dropped);
}

static int check(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return 1;
    const char* why = NULL;
    cuptiGetResultString(r, &why);
    fprintf(stderr, "kernel_trace: %s failed: %s\n", what, why ? why : "unknown error");
    return 0;
}

/* Called by the CUDA driver once, at cuInit (CUDA_INJECTION64_PATH). */
int InitializeInjection(void) {
    const char* path = getenv("KERNEL_TRACE_OUT");
    if (!path || !*path) path = "kernel_trace.csv";
    trace_out = fopen(path, "w");
    if (!trace_out) {
        fprintf(stderr, "kernel_trace: cannot write %s: no trace\n", path);
        return 0;
    }
    fputs("graph,node,start_ns,end_ns,blocks,threads,name\n", trace_out);
    if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
               "cuptiActivityRegisterCallbacks") ||
        !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
               "cuptiActivityEnable(CONCURRENT_KERNEL)"))
        return 0;
    atexit(finish);
    return 1;
}
