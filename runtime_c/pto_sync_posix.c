/* pto_sync_posix.c - optional platform adapter: the runtime's sync hooks on pthreads.
 *
 * The runtime core (the files pto_runtime_internal.h lists) stays free of platform headers;
 * it calls lock/unlock around every public function, wait while pto_task_alloc finds the
 * window full, and notify_all after completions. This file implements those hooks with one
 * mutex and one condition variable, so an orchestration thread can block in pto_task_alloc
 * while an executor thread pops and completes tasks.
 */

#include <pthread.h>
#include <stdlib.h>

#include "pto_runtime.h"

typedef struct {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
} pto_sync_posix;

static void posix_lock(void *ctx)
{
    pthread_mutex_lock(&((pto_sync_posix *)ctx)->mutex);
}

static void posix_unlock(void *ctx)
{
    pthread_mutex_unlock(&((pto_sync_posix *)ctx)->mutex);
}

/* Called with the mutex held (inside a locked runtime call); returns with it held. The
 * caller re-checks its condition in a loop, so spurious wake-ups are harmless. */
static void posix_wait(void *ctx)
{
    pto_sync_posix *s = ctx;
    pthread_cond_wait(&s->cond, &s->mutex);
}

static void posix_notify_all(void *ctx)
{
    pthread_cond_broadcast(&((pto_sync_posix *)ctx)->cond);
}

/* Install the pthread hooks into a caller-owned config (before pto_runtime_create). */
int pto_sync_posix_init(pto_config *cfg)
{
    pto_sync_posix *s;
    if (cfg == NULL || cfg->sync_ctx != NULL) {
        return PTO_ERR_INVALID;
    }
    s = malloc(sizeof *s);
    if (s == NULL) {
        return PTO_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&s->mutex, NULL) != 0) {
        free(s);
        return PTO_ERR_NO_MEMORY;
    }
    if (pthread_cond_init(&s->cond, NULL) != 0) {
        pthread_mutex_destroy(&s->mutex);
        free(s);
        return PTO_ERR_NO_MEMORY;
    }
    cfg->sync_ctx = s;
    cfg->lock = posix_lock;
    cfg->unlock = posix_unlock;
    cfg->wait = posix_wait;
    cfg->notify_all = posix_notify_all;
    return PTO_OK;
}

/* Release what pto_sync_posix_init made; call after pto_runtime_destroy. */
int pto_sync_posix_free(pto_config *cfg)
{
    pto_sync_posix *s;
    if (cfg == NULL) {
        return PTO_ERR_INVALID;
    }
    s = cfg->sync_ctx;
    if (s != NULL) {
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->mutex);
        free(s);
    }
    cfg->sync_ctx = NULL;
    cfg->lock = NULL;
    cfg->unlock = NULL;
    cfg->wait = NULL;
    cfg->notify_all = NULL;
    return PTO_OK;
}
