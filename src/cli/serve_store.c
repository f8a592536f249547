/* h3run serve's job store: one SQLite file (serve.h). */
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "cli/serve.h"

struct h3_store {
    sqlite3 *db;
};

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static h3_status db_err(h3_store *s, const char *what) {
    return H3_ERR(H3_ERR_IO, "the job store: %s: %s", what, sqlite3_errmsg(s->db));
}

static h3_status exec(h3_store *s, const char *sql) {
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        h3_status st = H3_ERR(H3_ERR_IO, "the job store: %s: %s", sql, msg ? msg : "?");
        sqlite3_free(msg);
        return st;
    }
    return H3_OK;
}

h3_status h3_store_open(const char *path, h3_store **out) {
    *out = NULL;
    h3_store *s = h3_calloc(1, sizeof *s, H3_MEM_OTHER);
    if (!s) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st = H3_OK;
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        NULL) != SQLITE_OK)
        H3_FAIL(H3_ERR_IO, "the job store %s cannot be opened: %s", path,
                s->db ? sqlite3_errmsg(s->db) : "out of memory");
    sqlite3_busy_timeout(s->db, 5000);
    H3_CHECK(exec(s, "PRAGMA journal_mode=WAL"));
    H3_CHECK(exec(s, "PRAGMA synchronous=FULL"));
    H3_CHECK(exec(s, "CREATE TABLE IF NOT EXISTS jobs ("
                     " id INTEGER PRIMARY KEY AUTOINCREMENT,"
                     " state TEXT NOT NULL,"
                     " request TEXT NOT NULL,"
                     " created REAL NOT NULL,"
                     " started REAL,"
                     " finished REAL,"
                     " message TEXT,"
                     " report TEXT,"
                     " attempts INTEGER NOT NULL DEFAULT 0)"));
    *out = s;
    return H3_OK;
done:
    h3_store_close(s);
    return st;
}

void h3_store_close(h3_store *s) {
    if (!s) return;
    if (s->db) sqlite3_close(s->db);
    h3_free(s);
}

int h3_store_requeue_interrupted(h3_store *s) {
    if (exec(s, "UPDATE jobs SET state='queued' WHERE state IN ('planning','running')") != H3_OK) return -1;
    return sqlite3_changes(s->db);
}

h3_status h3_store_add(h3_store *s, const char *request, int64_t *id) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db, "INSERT INTO jobs(state, request, created) VALUES('queued', ?, ?)", -1, &q,
                           NULL) != SQLITE_OK)
        return db_err(s, "adding a job");
    sqlite3_bind_text(q, 1, request, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(q, 2, wall_s());
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return db_err(s, "adding a job");
    *id = sqlite3_last_insert_rowid(s->db);
    return H3_OK;
}

h3_status h3_store_next(h3_store *s, int64_t *id, char **request) {
    *id = 0;
    *request = NULL;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT id, request FROM jobs WHERE state='queued' ORDER BY id LIMIT 1", -1,
                           &q, NULL) != SQLITE_OK)
        return db_err(s, "finding the next job");
    h3_status st = H3_OK;
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        *request = h3_strdup((const char *)sqlite3_column_text(q, 1));
        if (!*request)
            st = H3_ERR(H3_ERR_NOMEM, "out of memory");
        else
            *id = sqlite3_column_int64(q, 0);
    } else if (rc != SQLITE_DONE) {
        st = db_err(s, "finding the next job");
    }
    sqlite3_finalize(q);
    return st;
}

h3_status h3_store_set_state(h3_store *s, int64_t id, const char *state, const char *message,
                             const char *report) {
    const int start = !strcmp(state, H3_JOB_PLANNING);
    const int end =
        !strcmp(state, H3_JOB_DONE) || !strcmp(state, H3_JOB_FAILED) || !strcmp(state, H3_JOB_CANCELLED);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(
            s->db,
            "UPDATE jobs SET state=?1, message=COALESCE(?2, message), report=COALESCE(?3, report),"
            " started=CASE WHEN ?4 THEN ?6 ELSE started END,"
            " finished=CASE WHEN ?5 THEN ?6 WHEN ?4 THEN NULL ELSE finished END,"
            " attempts=attempts + ?4 WHERE id=?7",
            -1, &q, NULL) != SQLITE_OK)
        return db_err(s, "updating a job");
    sqlite3_bind_text(q, 1, state, -1, SQLITE_STATIC);
    if (message) sqlite3_bind_text(q, 2, message, -1, SQLITE_TRANSIENT);
    if (report) sqlite3_bind_text(q, 3, report, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(q, 4, start);
    sqlite3_bind_int(q, 5, end);
    sqlite3_bind_double(q, 6, wall_s());
    sqlite3_bind_int64(q, 7, id);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? H3_OK : db_err(s, "updating a job");
}

/* The row's columns as a JSON object: id, state, request, created, started, finished, message, report,
 * attempts. */
static json_t *row_json(sqlite3_stmt *q) {
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "id", json_integer(sqlite3_column_int64(q, 0)));
    json_object_set_new(o, "state", json_string((const char *)sqlite3_column_text(q, 1)));
    json_t *req = json_loads((const char *)sqlite3_column_text(q, 2), 0, NULL);
    json_object_set_new(o, "request", req ? req : json_null());
    static const char *const times[3] = {"created", "started", "finished"};
    for (int i = 0; i < 3; i++)
        json_object_set_new(o, times[i],
                            sqlite3_column_type(q, 3 + i) == SQLITE_NULL
                                ? json_null()
                                : json_real(sqlite3_column_double(q, 3 + i)));
    const char *msg = (const char *)sqlite3_column_text(q, 6);
    json_object_set_new(o, "message", msg ? json_string(msg) : json_null());
    const char *rep = (const char *)sqlite3_column_text(q, 7);
    json_t *r = rep ? json_loads(rep, 0, NULL) : NULL;
    json_object_set_new(o, "report", r ? r : json_null());
    json_object_set_new(o, "attempts", json_integer(sqlite3_column_int64(q, 8)));
    return o;
}

#define JOB_COLUMNS "id, state, request, created, started, finished, message, report, attempts"

h3_status h3_store_get(h3_store *s, int64_t id, json_t **job) {
    *job = NULL;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT " JOB_COLUMNS " FROM jobs WHERE id=?", -1, &q, NULL) != SQLITE_OK)
        return db_err(s, "reading a job");
    sqlite3_bind_int64(q, 1, id);
    h3_status st = H3_OK;
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        *job = row_json(q);
        if (!*job) st = H3_ERR(H3_ERR_NOMEM, "out of memory");
    } else if (rc == SQLITE_DONE) {
        st = H3_ERR(H3_ERR_NOT_FOUND, "there is no job %lld (GET /api/jobs lists them)", (long long)id);
    } else {
        st = db_err(s, "reading a job");
    }
    sqlite3_finalize(q);
    return st;
}

h3_status h3_store_list(h3_store *s, json_t **jobs) {
    *jobs = json_array();
    if (!*jobs) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT " JOB_COLUMNS " FROM jobs ORDER BY id", -1, &q, NULL) != SQLITE_OK)
        return db_err(s, "listing the jobs");
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        json_t *o = row_json(q);
        if (o) json_array_append_new(*jobs, o);
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? H3_OK : db_err(s, "listing the jobs");
}

h3_status h3_store_delete(h3_store *s, int64_t id) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db, "DELETE FROM jobs WHERE id=?", -1, &q, NULL) != SQLITE_OK)
        return db_err(s, "deleting a job");
    sqlite3_bind_int64(q, 1, id);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? H3_OK : db_err(s, "deleting a job");
}

int64_t h3_store_count(h3_store *s, const char *state) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db,
                           state ? "SELECT COUNT(*) FROM jobs WHERE state=?" : "SELECT COUNT(*) FROM jobs",
                           -1, &q, NULL) != SQLITE_OK)
        return -1;
    if (state) sqlite3_bind_text(q, 1, state, -1, SQLITE_STATIC);
    int64_t n = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    return n;
}
