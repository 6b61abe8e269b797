// Counts the graph evaluations (ubatches) a llama.cpp process runs: an LD_PRELOAD shim over
// ggml_backend_sched_graph_compute_async, the one call every llama_decode ubatch makes.
//
//   cc -O2 -shared -fPIC -o graph-count.so lab/scripts/graph-count.c -ldl
//   GRAPH_COUNT_FILE=/tmp/n LD_PRELOAD=$PWD/graph-count.so llama-server ...
//
// The count lives in GRAPH_COUNT_FILE (8 bytes, little-endian, mapped shared), so another process reads it while
// the server runs: python3 -c "import sys; print(int.from_bytes(open(sys.argv[1],'rb').read(8),'little'))" /tmp/n
// Used by python -m lab.runs.gpu_concurrency to show how many forwards a decode step of N streams costs (patch 0034).
// Without GRAPH_COUNT_FILE it only forwards the call.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*compute_fn)(void *sched, void *graph);

static volatile uint64_t *counter;
static compute_fn real_compute;

__attribute__((constructor)) static void graph_count_init(void) {
    const char *path = getenv("GRAPH_COUNT_FILE");
    if (!path || !*path) {
        return;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, sizeof(uint64_t)) != 0) {
        return;
    }
    void *p = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) {
        counter = (volatile uint64_t *) p;
    }
}

int ggml_backend_sched_graph_compute_async(void *sched, void *graph) {
    if (!real_compute) {
        real_compute = (compute_fn) dlsym(RTLD_NEXT, "ggml_backend_sched_graph_compute_async");
    }
    if (counter) {
        __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    }
    return real_compute(sched, graph);
}
