/* cuBLASLt opened on first use, not linked: starting any process linked against libcublasLt.so costs 0.4-0.6 s of
 * CPU (its initializers run at load), which every CLI run, test and tool of a CUDA build paid, GPU or not
 * (docs/TESTING.md). The functions gemm.cu calls are defined here with cublasLt.h's own declarations and forward to
 * the library, which the first cublasLtCreate opens: by its soname on the binary's search path (RUNPATH,
 * LD_LIBRARY_PATH, the loader's cache), else from the toolkit the build used. When it cannot be opened, every call
 * reports CUBLAS_STATUS_NOT_INITIALIZED and cublasGetStatusName says why. */
#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define KITE_CUBLASLT_SONAME "libcublasLt.so." KITE_STRINGIFY(CUBLAS_VER_MAJOR)
#define KITE_STRINGIFY(x) KITE_STRINGIFY_(x)
#define KITE_STRINGIFY_(x) #x

namespace {

struct cublaslt_functions {
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatrixLayoutSetAttribute) layout_set;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatmulPreferenceCreate) preference_create;
    decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtMatmul) matmul;
    decltype(&cublasLtGetStatusName) status_name;
};

cublaslt_functions lt;
bool lt_loaded;
char lt_failure[512];
pthread_once_t lt_once = PTHREAD_ONCE_INIT;

template <typename F> bool find(void *library, const char *name, F *out) {
    *out = reinterpret_cast<F>(dlsym(library, name));
    if (*out) return true;
    snprintf(lt_failure, sizeof lt_failure, "%s has no %s", KITE_CUBLASLT_SONAME, name);
    return false;
}

void load(void) {
    void *library = dlopen(KITE_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        const char *first = dlerror();
        snprintf(lt_failure, sizeof lt_failure, "cannot open %s: %s", KITE_CUBLASLT_SONAME, first ? first : "?");
        library = dlopen(KITE_CUBLASLT_TOOLKIT_DIR "/" KITE_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
        if (!library) return;
    }
    lt_loaded = find(library, "cublasLtCreate", &lt.create) && find(library, "cublasLtDestroy", &lt.destroy) &&
                find(library, "cublasLtMatrixLayoutCreate", &lt.layout_create) &&
                find(library, "cublasLtMatrixLayoutDestroy", &lt.layout_destroy) &&
                find(library, "cublasLtMatrixLayoutSetAttribute", &lt.layout_set) &&
                find(library, "cublasLtMatmulDescCreate", &lt.desc_create) &&
                find(library, "cublasLtMatmulDescDestroy", &lt.desc_destroy) &&
                find(library, "cublasLtMatmulDescSetAttribute", &lt.desc_set) &&
                find(library, "cublasLtMatmulPreferenceCreate", &lt.preference_create) &&
                find(library, "cublasLtMatmulPreferenceDestroy", &lt.preference_destroy) &&
                find(library, "cublasLtMatmulPreferenceSetAttribute", &lt.preference_set) &&
                find(library, "cublasLtMatmulAlgoGetHeuristic", &lt.heuristic) &&
                find(library, "cublasLtMatmul", &lt.matmul) && find(library, "cublasLtGetStatusName", &lt.status_name);
}

/* Every call but the first finds the library opened (or not) by then: cublasLtCreate comes before any other. */
bool loaded(void) { return pthread_once(&lt_once, load) == 0 && lt_loaded; }

} // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *handle) {
    return loaded() ? lt.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
    return loaded() ? lt.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
    return loaded() ? lt.layout_create(layout, type, rows, cols, ld) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    return loaded() ? lt.layout_destroy(layout) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attribute, const void *buffer,
                                                             size_t size) {
    return loaded() ? lt.layout_set(layout, attribute, buffer, size) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute_type,
                                                     cudaDataType_t scale_type) {
    return loaded() ? lt.desc_create(desc, compute_type, scale_type) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    return loaded() ? lt.desc_destroy(desc) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attribute, const void *buffer,
                                                           size_t size) {
    return loaded() ? lt.desc_set(desc, attribute, buffer, size) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *preference) {
    return loaded() ? lt.preference_create(preference) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
    return loaded() ? lt.preference_destroy(preference) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                                 cublasLtMatmulPreferenceAttributes_t attribute,
                                                                 const void *buffer, size_t size) {
    return loaded() ? lt.preference_set(preference, attribute, buffer, size) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                           cublasLtMatmulPreference_t preference, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int *returned) {
    return loaded() ? lt.heuristic(handle, desc, a, b, c, d, preference, requested, results, returned)
                    : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                                           const void *a, cublasLtMatrixLayout_t a_layout, const void *b,
                                           cublasLtMatrixLayout_t b_layout, const void *beta, const void *c,
                                           cublasLtMatrixLayout_t c_layout, void *d, cublasLtMatrixLayout_t d_layout,
                                           const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_size,
                                           cudaStream_t stream) {
    return loaded() ? lt.matmul(handle, desc, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout, algo,
                                workspace, workspace_size, stream)
                    : CUBLAS_STATUS_NOT_INITIALIZED;
}

/* gemm.cu names failures with cuBLAS's cublasGetStatusName: the same names, from cuBLASLt, and why it is missing. */
const char *CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
    if (loaded()) return lt.status_name(status);
    return lt_failure[0] ? lt_failure : "cuBLASLt is not loaded";
}

} // extern "C"
