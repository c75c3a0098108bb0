/* pto_runtime.h - public C header of the PTO task-graph runtime.
 *
 * Generated orchestration code and C drivers include this file. The declarations live in
 * pto_kernel_abi.h and pto_runtime_api.h (kept macro-free so cffi can read them verbatim);
 * this wrapper adds the standard headers they need and C-only conveniences.
 */
#ifndef PTO_RUNTIME_H
#define PTO_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "pto_kernel_abi.h"
#include "pto_runtime_api.h"

/* Evaluate a runtime call and return its status from the enclosing function (which must
 * return int) when it is not PTO_OK, so generated code stays one line per call. */
#define PTO_TRY(expr)                      \
    do {                                   \
        int pto_try_status_ = (expr);      \
        if (pto_try_status_ != PTO_OK) {   \
            return pto_try_status_;        \
        }                                  \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* PTO_RUNTIME_H */
