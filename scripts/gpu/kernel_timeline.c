/*
 * kernel_timeline.c: every kernel a process runs, with its start and end on the
 * GPU's clock, written as CSV at exit. A development tool for the GPU machine,
 * where Nsight Systems cannot make a report (the device README): it shows where
 * the time of a graphed decode step goes between kernels (programmatic launches
 * overlap, so a kernel's share of the step is its end minus the previous one's
 * end, not its duration), which ncu, replaying each launch alone, cannot.
 *
 * Loaded by the CUDA driver itself (no change to the traced program):
 *   CUDA_INJECTION64_PATH=/path/libkernel_timeline.so MINISGL_TIMELINE=/tmp/t.csv prog
 * The driver calls InitializeInjection() at cuInit; it turns on CUPTI's
 * concurrent-kernel activity records (which keep kernels concurrent, unlike the
 * serialising kernel records) and flushes them at exit. Columns: start_ns, end_ns,
 * graph_id, graph_node_id, stream, grid, block, cluster, registers, dynamic
 * shared memory, mangled name (scripts/gpu/timeline_table.py reads it).
 *
 * Build: scripts/gpu/build_timeline.sh (here, after `cargo xtask gpu-bundle`: it
 * puts the library and CUPTI's libcupti.so.13, from the nvidia-cuda-cupti wheel of
 * the pinned CUDA 13.0 toolkit, into .gpu/).
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Activity buffers handed to CUPTI: 8 MiB each (~20,000 kernel records). */
#define TIMELINE_BUFFER_BYTES (8u << 20)

static FILE* timeline_out;
static unsigned long long timeline_records, timeline_dropped;

static void timeline_check(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) {
    const char* msg = "?";
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "kernel_timeline: %s: %s\n", what, msg);
  }
}

static void CUPTIAPI timeline_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  /* CUPTI wants 8-byte aligned buffers. */
  *buffer = (uint8_t*)aligned_alloc(8, TIMELINE_BUFFER_BYTES);
  *size = *buffer ? TIMELINE_BUFFER_BYTES : 0;
  *max_records = 0;
}

static void CUPTIAPI timeline_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size,
                                               size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity* record = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)record;
    if (timeline_out)
      fprintf(timeline_out, "%llu,%llu,%u,%llu,%u,%dx%dx%d,%dx%dx%d,%ux%ux%u,%u,%d,%s\n", (unsigned long long)k->start,
              (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId, k->streamId, k->gridX,
              k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ, k->clusterX, k->clusterY, k->clusterZ,
              k->registersPerThread, k->dynamicSharedMemory, k->name ? k->name : "?");
    ++timeline_records;
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) timeline_dropped += dropped;
  free(buffer);
}

static void timeline_finish(void) {
  timeline_check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  if (timeline_out) {
    fclose(timeline_out);
    timeline_out = NULL;
  }
  fprintf(stderr, "kernel_timeline: %llu kernels written, %llu dropped\n", timeline_records, timeline_dropped);
}

/* The driver's entry point for CUDA_INJECTION64_PATH libraries. */
__attribute__((visibility("default"))) int InitializeInjection(void) {
  const char* path = getenv("MINISGL_TIMELINE");
  timeline_out = fopen(path && *path ? path : "/tmp/kernel_timeline.csv", "w");
  if (!timeline_out) {
    fprintf(stderr, "kernel_timeline: cannot write %s\n", path ? path : "/tmp/kernel_timeline.csv");
    return 0;
  }
  fprintf(timeline_out, "start_ns,end_ns,graph_id,graph_node_id,stream,grid,block,cluster,registers,dyn_smem,name\n");
  timeline_check(cuptiActivityRegisterCallbacks(timeline_buffer_requested, timeline_buffer_completed), "callbacks");
  timeline_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable");
  atexit(timeline_finish);
  return 1;
}
