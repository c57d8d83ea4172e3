/* The simulator's untraced run (simulator/engine.py) in C: the same processes, events, fluid
 * sharing and memory ledger, step for step, so every time and byte comes out identical (tests/
 * simulator/test_native.py holds the two equal). engine.py is the reference and keeps the
 * traced runs; this file runs a search's simulations, hundreds a search.
 *
 * Exactness: events are scheduled in the Python kernel's order (time, priority, then the order
 * they were scheduled in) and their callbacks run in the order they were added; floating point
 * follows the Python expressions operation for operation (built with -ffp-contract=off). Any
 * state Python would raise on ends the run with a non-zero status (as does one this file does
 * not model: more than 64 resources): the caller reruns it in Python, which raises the error
 * itself or runs it. The caller hands over only finite numbers (native._CostArrays), so NaN
 * can mark what is unset. Out of memory aborts. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DONE_EPS_S 1e-9 /* sharing.py's _DONE_EPS_S */
#define SMALL_REQUEST_BYTES (1LL << 20) /* allocator.py's constants */
#define SMALL_PAGE_BYTES (2LL << 20)
#define LARGE_PAGE_BYTES (20LL << 20)
#define MIN_BLOCK_BYTES 512LL

enum { URGENT = 0, NORMAL = 1 };
enum { PENDING = 0, TRIGGERED = 1, PROCESSED = 2 };
enum { CB_RESUME, CB_ALLOF, CB_TIMER };
enum { HOST_THREAD, STREAM, WORKER };
enum { ERR_OK = 0, ERR_MEMORY = 1, ERR_STATE = 2, ERR_STALLED = 3, ERR_ZERO_RATE = 4 };

typedef struct {
  int32_t n_tasks, n_lanes, run_ahead;
  const int32_t *lane_start;  /* n_lanes + 1: tasks are numbered lane by lane, in lane order */
  const int8_t *lane_strict;  /* 1: a stream fed by a host thread; 0: a worker */
  const int32_t *task_shape;
  const int32_t *succ_off, *succ, *pred_off, *pred; /* the graph's edges, in its order */
  const double *solo_s, *dispatch_s, *share, *dispatch_share; /* per shape */
  const int32_t *tag;
  const int32_t *use_off, *use_res, *duse_off, *duse_res;
  const double *use_demand, *duse_demand;
  int32_t n_resources;
  const double *capacity, *mixed_capacity; /* mixed: read where has_mixed */
  const int8_t *has_mixed;
  int32_t n_tiers, gpu_tier, n_buffers;
  const int32_t *buf_tier, *buf_alloc_task; /* alloc task -1: held before the plan runs */
  const int64_t *buf_bytes;
  const int8_t *buf_at_end, *buf_outlives;
  int32_t runtime_buffer; /* the GPU's runtime (held, not a block the allocator hands out) */
  const int32_t *rel_off, *rel_task;
} SimInput;

typedef struct {
  double *start_s, *end_s;       /* per task; end NaN if it never ended */
  double *span_start, *span_end; /* lane by lane, in the order each lane ran its tasks */
  int32_t *ran;                  /* the same, each run's task */
  int64_t *static_in_use, *peak; /* per tier */
  int64_t *held_peak;            /* one */
  /* per pool (0: static, 1 + lane): its peak, and the order it was first used (-1: never) */
  int64_t *pool_peak, *pool_reserved;
  int32_t *pool_peak_rank, *pool_reserved_rank;
} SimOutput;

/* ---- growable arrays ---------------------------------------------------------------------- */
#define GROW(ptr, count, cap)                                                    \
  do {                                                                           \
    if ((count) >= (cap)) {                                                      \
      (cap) = (cap) ? 2 * (cap) : 16;                                            \
      void *grown_ = realloc((ptr), (size_t)(cap) * sizeof(*(ptr)));             \
      if (!grown_) abort();                                                      \
      (ptr) = grown_;                                                            \
    }                                                                            \
  } while (0)

typedef struct { int8_t state; int32_t head, tail, left; } Event;
typedef struct { int32_t type, arg, next; } Callback;
typedef struct { double t; int32_t prio; int64_t eid; int32_t event; } Scheduled;

typedef struct {
  int32_t type, lane, pc, i, count, task;
  int32_t *heap, heap_n, heap_cap, wakeup; /* a worker's ready tasks (by order), wake-up */
} Process;

typedef struct {
  double remaining_s, share, rate;
  int32_t tag, done, n_uses, stamp;
  const int32_t *res;
  const double *demand;
} Flow;

typedef struct { int32_t flow; double demand; } Member;
typedef struct { int64_t start, size; int8_t free; } Block;
typedef struct { int32_t pool, n, cap; int8_t small; int64_t page, mapped; Block *blocks; } Segment;

typedef struct {
  int32_t tier, pool, pending, own_left, other_left, host_left, segment;
  int64_t bytes, start;
  int8_t allocated;
} Held;

typedef struct { int32_t *off, *item; int8_t *flag; } Lists; /* per task: CSR of items */

typedef struct {
  const SimInput *in;
  SimOutput *out;
  int error;
  double now;
  int64_t eid;
  Event *events; int32_t n_events, cap_events;
  Callback *cbs; int32_t n_cbs, cap_cbs;
  Scheduled *queue; int32_t n_queue, cap_queue;
  Process *procs; int32_t n_procs;
  int32_t *task_lane, *waiting_on, *worker_of_lane;
  int32_t *ran, *ran_n; /* per lane, the tasks in the order they ran */
  /* sharing */
  Flow *flows; int32_t n_flows, cap_flows;
  double *limits; int32_t cap_limits; /* flow * n_resources; NaN: not limited there */
  int32_t *active, n_active, cap_active;
  Member **members; int32_t *n_members, *cap_members;
  int8_t *is_short;
  int32_t timer, stamp;
  double last_s;
  int32_t *scratch_idx; double *scratch_f, *scratch_d, *scratch_w; int32_t cap_scratch;
  int32_t *changed, cap_changed;
  /* memory */
  Held *held;
  int64_t *in_use, held_bytes, *pool_in_use;
  int32_t pool_rank_next, reserved_rank_next;
  int32_t *inputs, cap_inputs; /* a release's inputs, removed after its outputs come */
  Lists starts, ends, releases, gpu_starts, gpu_ends, drops_first, drops_last, other_users;
  Segment *segments; int32_t n_segments, cap_segments;
} Sim;

#define must_malloc(n) must(malloc(n))
#define must_calloc(n, k) must(calloc((n), (k)))
static void *must(void *p) { /* as GROW: out of memory aborts */
  if (!p) abort();
  return p;
}

/* ---- the kernel: events, callbacks, the queue --------------------------------------------- */
static int new_event(Sim *s) {
  GROW(s->events, s->n_events, s->cap_events);
  Event *e = &s->events[s->n_events];
  e->state = PENDING; e->head = e->tail = -1; e->left = 0;
  return s->n_events++;
}

static void add_callback(Sim *s, int32_t ev, int32_t type, int32_t arg) {
  GROW(s->cbs, s->n_cbs, s->cap_cbs);
  int32_t c = s->n_cbs++;
  s->cbs[c].type = type; s->cbs[c].arg = arg; s->cbs[c].next = -1;
  Event *e = &s->events[ev];
  if (e->tail < 0) e->head = c; else s->cbs[e->tail].next = c;
  e->tail = c;
}

static int earlier(const Scheduled *a, const Scheduled *b) {
  if (a->t != b->t) return a->t < b->t;
  if (a->prio != b->prio) return a->prio < b->prio;
  return a->eid < b->eid;
}

static void schedule(Sim *s, int32_t ev, double t, int32_t prio) {
  s->events[ev].state = TRIGGERED;
  GROW(s->queue, s->n_queue, s->cap_queue);
  Scheduled item = {t, prio, s->eid++, ev};
  int32_t i = s->n_queue++;
  while (i > 0) {
    int32_t parent = (i - 1) / 2;
    if (!earlier(&item, &s->queue[parent])) break;
    s->queue[i] = s->queue[parent];
    i = parent;
  }
  s->queue[i] = item;
}

static Scheduled pop_queue(Sim *s) {
  Scheduled top = s->queue[0], last = s->queue[--s->n_queue];
  int32_t i = 0, n = s->n_queue;
  for (;;) {
    int32_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && earlier(&s->queue[child + 1], &s->queue[child])) child++;
    if (!earlier(&s->queue[child], &last)) break;
    s->queue[i] = s->queue[child];
    i = child;
  }
  if (n) s->queue[i] = last;
  return top;
}

static void succeed(Sim *s, int32_t ev) {
  if (s->events[ev].state != PENDING) { s->error = ERR_STATE; return; }
  schedule(s, ev, s->now, NORMAL);
}

static int32_t timeout(Sim *s, double delay) {
  int32_t ev = new_event(s);
  schedule(s, ev, s->now + delay, NORMAL);
  return ev;
}

static void allof_check(Sim *s, int32_t allof) {
  if (--s->events[allof].left == 0) succeed(s, allof);
}

/* kernel.AllOf: scheduled once each of its events has been processed */
static int32_t all_of(Sim *s, const int32_t *evs, int32_t count) {
  int32_t a = new_event(s);
  s->events[a].left = count;
  if (!count) { succeed(s, a); return a; }
  for (int32_t k = 0; k < count; k++) {
    if (s->events[evs[k]].state == PROCESSED) allof_check(s, a);
    else add_callback(s, evs[k], CB_ALLOF, a);
  }
  return a;
}

/* A process yields ev: 1 if it must wait (resumed when ev is processed), 0 if ev already was. */
static int wait_for(Sim *s, int32_t proc, int32_t ev) {
  if (s->events[ev].state == PROCESSED) return 0;
  add_callback(s, ev, CB_RESUME, proc);
  return 1;
}

/* per task: its events (enqueued, ready, dispatched, finished) */
#define ENQUEUED(t) (4 * (t))
#define READY(t) (4 * (t) + 1)
#define DISPATCHED(t) (4 * (t) + 2)
#define FINISHED(t) (4 * (t) + 3)

/* ---- sharing.py: fluid sharing of bandwidth ----------------------------------------------- */
static void advance(Sim *s) {
  double elapsed = s->now - s->last_s;
  if (elapsed > 0)
    for (int32_t k = 0; k < s->n_active; k++) {
      Flow *f = &s->flows[s->active[k]];
      f->remaining_s -= elapsed * f->rate;
    }
  s->last_s = s->now;
}

static void ensure_scratch(Sim *s, int32_t n) {
  if (n <= s->cap_scratch) return;
  s->cap_scratch = 2 * n;
  s->scratch_idx = realloc(s->scratch_idx, (size_t)s->cap_scratch * sizeof(int32_t));
  s->scratch_f = realloc(s->scratch_f, (size_t)s->cap_scratch * sizeof(double));
  s->scratch_d = realloc(s->scratch_d, (size_t)s->cap_scratch * sizeof(double));
  s->scratch_w = realloc(s->scratch_w, (size_t)s->cap_scratch * sizeof(double));
  if (!s->scratch_idx || !s->scratch_f || !s->scratch_d || !s->scratch_w) abort();
}

/* sharing.water_fill, into s->scratch_f */
static void water_fill(Sim *s, int32_t n, double capacity) {
  const double *d = s->scratch_d, *w = s->scratch_w;
  double *fractions = s->scratch_f;
  int32_t *order = s->scratch_idx, n_order = 0;
  for (int32_t i = 0; i < n; i++) { /* a stable sort by 1 / weight */
    fractions[i] = d[i] > 0 ? 0.0 : 1.0;
    if (!(d[i] > 0)) continue;
    double key = 1.0 / w[i];
    int32_t j = n_order++;
    while (j > 0 && key < 1.0 / w[order[j - 1]]) { order[j] = order[j - 1]; j--; }
    order[j] = i;
  }
  double left = capacity, weighted = 0.0;
  for (int32_t i = 0; i < n; i++) weighted += d[i] * w[i];
  for (int32_t k = 0; k < n_order; k++) {
    int32_t idx = order[k];
    double lam = weighted > 0 ? left / weighted : 0.0;
    if (lam * w[idx] >= 1.0) {
      fractions[idx] = 1.0;
      left -= d[idx];
      weighted -= d[idx] * w[idx];
    } else {
      for (int32_t j = k; j < n_order; j++) fractions[order[j]] = lam * w[order[j]];
      break;
    }
  }
}

/* sharing._shares: 1 and each member's fraction in scratch_f where the resource is short */
static int shares(Sim *s, int32_t r) {
  int32_t n = s->n_members[r];
  if (!n) return 0;
  const Member *m = s->members[r];
  double capacity = s->in->capacity[r];
  if (s->in->has_mixed[r])
    for (int32_t k = 1; k < n; k++)
      if (s->flows[m[k].flow].tag != s->flows[m[0].flow].tag) {
        capacity = s->in->mixed_capacity[r];
        break;
      }
  ensure_scratch(s, n);
  double total = 0.0;
  for (int32_t k = 0; k < n; k++) {
    s->scratch_d[k] = m[k].demand;
    s->scratch_w[k] = s->flows[m[k].flow].share;
    total += m[k].demand;
  }
  if (total <= capacity) return 0;
  water_fill(s, n, capacity);
  return 1;
}

static void reallocate(Sim *s, const int8_t *touched) {
  int32_t R = s->in->n_resources, n_changed = 0;
  s->stamp++;
  for (int32_t r = 0; r < R; r++) {
    if (!touched[r]) continue;
    int is_short = shares(s, r);
    if (!is_short && !s->is_short[r]) continue;
    const Member *m = s->members[r];
    int32_t n = s->n_members[r];
    for (int32_t k = 0; k < n; k++) {
      Flow *f = &s->flows[m[k].flow];
      s->limits[(size_t)m[k].flow * R + r] = NAN;
      if (f->stamp != s->stamp) {
        f->stamp = s->stamp;
        GROW(s->changed, n_changed, s->cap_changed);
        s->changed[n_changed++] = m[k].flow;
      }
    }
    if (is_short)
      for (int32_t k = 0; k < n; k++) {
        double *limit = &s->limits[(size_t)m[k].flow * R + r], fraction = s->scratch_f[k];
        *limit = isnan(*limit) || fraction < *limit ? fraction : *limit;
      }
    s->is_short[r] = (int8_t)is_short;
  }
  for (int32_t k = 0; k < n_changed; k++) {
    Flow *f = &s->flows[s->changed[k]];
    double rate = 1.0;
    for (int32_t r = 0; r < R; r++) {
      double limit = s->limits[(size_t)s->changed[k] * R + r];
      if (!isnan(limit) && limit < rate) rate = limit;
    }
    f->rate = rate;
  }
}

static void schedule_timer(Sim *s) {
  if (!s->n_active) { s->timer = -1; return; }
  double next_s = INFINITY;
  for (int32_t k = 0; k < s->n_active; k++) {
    const Flow *f = &s->flows[s->active[k]];
    if (f->rate == 0) { s->error = ERR_ZERO_RATE; return; }
    double t = f->remaining_s / f->rate;
    if (t < next_s) next_s = t;
  }
  s->timer = timeout(s, next_s > 0.0 ? next_s : 0.0);
  add_callback(s, s->timer, CB_TIMER, 0);
}

/* SharedResources.run: the event processed once the work is done */
static int32_t share_run(Sim *s, double solo_s, const int32_t *res, const double *demand,
                         int32_t n_uses, double share, int32_t tag) {
  int32_t done = new_event(s), R = s->in->n_resources;
  advance(s);
  GROW(s->flows, s->n_flows, s->cap_flows);
  int32_t fi = s->n_flows++;
  if ((size_t)s->n_flows * R > (size_t)s->cap_limits) {
    s->cap_limits = 2 * s->n_flows * R;
    s->limits = realloc(s->limits, (size_t)s->cap_limits * sizeof(double));
    if (!s->limits) abort();
  }
  for (int32_t r = 0; r < R; r++) s->limits[(size_t)fi * R + r] = NAN;
  Flow *f = &s->flows[fi];
  f->remaining_s = solo_s; f->share = share; f->rate = 1.0; f->tag = tag; f->done = done;
  f->n_uses = n_uses; f->res = res; f->demand = demand; f->stamp = 0;
  GROW(s->active, s->n_active, s->cap_active);
  s->active[s->n_active++] = fi;
  int8_t touched[64] = {0};
  for (int32_t k = 0; k < n_uses; k++) {
    int32_t r = res[k];
    GROW(s->members[r], s->n_members[r], s->cap_members[r]);
    s->members[r][s->n_members[r]++] = (Member){fi, demand[k]};
    touched[r] = 1;
  }
  reallocate(s, touched);
  schedule_timer(s);
  return done;
}

static void on_timer(Sim *s, int32_t timer) {
  if (timer != s->timer) return; /* the running set changed since it was set */
  advance(s);
  int8_t touched[64] = {0};
  int32_t kept = 0, n_finished = 0;
  ensure_scratch(s, s->n_active);
  int32_t *finished = s->scratch_idx; /* used up before reallocate needs the scratch */
  for (int32_t k = 0; k < s->n_active; k++) {
    int32_t fi = s->active[k];
    const Flow *f = &s->flows[fi];
    if (f->remaining_s <= DONE_EPS_S) {
      finished[n_finished++] = fi;
      for (int32_t u = 0; u < f->n_uses; u++) touched[f->res[u]] = 1;
    } else {
      s->active[kept++] = fi;
    }
  }
  s->n_active = kept;
  for (int32_t r = 0; r < s->in->n_resources; r++) {
    if (!touched[r]) continue;
    int32_t n = 0;
    for (int32_t k = 0; k < s->n_members[r]; k++)
      if (s->flows[s->members[r][k].flow].remaining_s > DONE_EPS_S)
        s->members[r][n++] = s->members[r][k];
    s->n_members[r] = n;
  }
  for (int32_t k = 0; k < n_finished; k++) succeed(s, s->flows[finished[k]].done);
  reallocate(s, touched);
  schedule_timer(s);
}

/* ---- allocator.py: the caching allocator's expandable segments ---------------------------- */
static int64_t ceil_to(int64_t n, int64_t unit) { /* Python's -(-n // unit) * unit */
  int64_t q = -n / unit, r = -n % unit;
  if (r != 0 && ((r < 0) != (unit < 0))) q -= 1; /* floor division */
  return -q * unit;
}

static void insert_block(Segment *g, int32_t at, Block b) {
  GROW(g->blocks, g->n, g->cap);
  memmove(&g->blocks[at + 1], &g->blocks[at], (size_t)(g->n - at) * sizeof(Block));
  g->blocks[at] = b;
  g->n++;
}

static void remove_block(Segment *g, int32_t at) {
  memmove(&g->blocks[at], &g->blocks[at + 1], (size_t)(g->n - at - 1) * sizeof(Block));
  g->n--;
}

static int64_t segment_allocate(Segment *g, int64_t size) {
  int32_t last = g->n - 1, best = -1;
  int64_t best_size = 0;
  for (int32_t i = 0; i < last; i++) {
    const Block *b = &g->blocks[i];
    if (b->free && b->size >= size && (best < 0 || b->size < best_size)) {
      best = i; best_size = b->size;
    }
  }
  if (best < 0 && last >= 0 && g->blocks[last].free && g->blocks[last].size >= size) best = last;
  if (best < 0) { /* _grow: map pages onto the end */
    int tail = g->n && g->blocks[g->n - 1].free;
    int64_t grow = ceil_to(size - (tail ? g->blocks[g->n - 1].size : 0), g->page);
    if (tail) g->blocks[g->n - 1].size += grow;
    else insert_block(g, g->n, (Block){g->mapped, grow, 1});
    g->mapped += grow;
    best = g->n - 1;
  }
  Block *block = &g->blocks[best];
  int64_t rest = block->size - size, start = block->start;
  if (rest > MIN_BLOCK_BYTES - 1) {
    block->size = size;
    insert_block(g, best + 1, (Block){start + size, rest, 1});
    block = &g->blocks[best];
  }
  block->free = 0;
  return start;
}

static int segment_free(Segment *g, int64_t start) {
  int32_t lo = 0, hi = g->n;
  while (lo < hi) {
    int32_t mid = (lo + hi) / 2;
    if (g->blocks[mid].start < start) lo = mid + 1; else hi = mid;
  }
  int32_t i = lo;
  if (i == g->n || g->blocks[i].start != start || g->blocks[i].free) return ERR_MEMORY;
  g->blocks[i].free = 1;
  if (i + 1 < g->n && g->blocks[i + 1].free) {
    g->blocks[i].size += g->blocks[i + 1].size;
    remove_block(g, i + 1);
  }
  if (i > 0 && g->blocks[i - 1].free) {
    g->blocks[i - 1].size += g->blocks[i].size;
    remove_block(g, i);
  }
  return ERR_OK;
}

static void allocator_request(Sim *s, Held *h) {
  if (h->allocated) { s->error = ERR_MEMORY; return; }
  int64_t size = ceil_to(h->bytes, MIN_BLOCK_BYTES);
  if (size < MIN_BLOCK_BYTES) size = MIN_BLOCK_BYTES;
  int8_t small = size <= SMALL_REQUEST_BYTES;
  int32_t g = 0;
  while (g < s->n_segments && !(s->segments[g].pool == h->pool && s->segments[g].small == small)) g++;
  if (g == s->n_segments) {
    GROW(s->segments, s->n_segments, s->cap_segments);
    s->segments[g] = (Segment){h->pool, 0, 0, small, small ? SMALL_PAGE_BYTES : LARGE_PAGE_BYTES,
                               0, NULL};
    s->n_segments++;
    if (s->out->pool_reserved_rank[h->pool] < 0)
      s->out->pool_reserved_rank[h->pool] = s->reserved_rank_next++;
  }
  h->segment = g;
  h->start = segment_allocate(&s->segments[g], size);
  h->allocated = 1;
}

static void allocator_free(Sim *s, Held *h) {
  if (!h->allocated) { s->error = ERR_MEMORY; return; }
  h->allocated = 0;
  if (segment_free(&s->segments[h->segment], h->start)) s->error = ERR_MEMORY;
}

/* ---- memory.py: the ledger ---------------------------------------------------------------- */
static void pool_add(Sim *s, int32_t pool, int64_t nbytes) {
  int64_t used = s->pool_in_use[pool] += nbytes;
  if (s->out->pool_peak_rank[pool] < 0) {
    s->out->pool_peak_rank[pool] = s->pool_rank_next++;
    s->out->pool_peak[pool] = 0;
  }
  if (used > s->out->pool_peak[pool]) s->out->pool_peak[pool] = used;
}

static void mem_add(Sim *s, const Held *h) {
  int64_t used = s->in_use[h->tier] += h->bytes;
  if (used > s->out->peak[h->tier]) s->out->peak[h->tier] = used;
  if (h->tier == s->in->gpu_tier) pool_add(s, h->pool, h->bytes);
}

static void mem_remove(Sim *s, const Held *h) {
  int64_t used = s->in_use[h->tier] -= h->bytes;
  if (used < 0) s->error = ERR_MEMORY;
  if (h->tier != s->in->gpu_tier) return;
  if (s->out->pool_peak_rank[h->pool] < 0) s->error = ERR_MEMORY; /* a pool nothing came to */
  s->pool_in_use[h->pool] -= h->bytes;
}

static void mem_request(Sim *s, Held *h) {
  allocator_request(s, h);
  s->held_bytes += h->bytes;
  if (s->held_bytes > *s->out->held_peak) *s->out->held_peak = s->held_bytes;
}

static void free_if_unused(Sim *s, Held *h) {
  if (h->own_left == 0 && h->other_left == 0) allocator_free(s, h);
}

static void dropped_by_host(Sim *s, Held *h, int own) {
  if (own) { h->own_left--; free_if_unused(s, h); }
  if (--h->host_left == 0) s->held_bytes -= h->bytes;
}

#define EACH(list, t, k) for (int32_t k = (list).off[t]; k < (list).off[(t) + 1]; k++)

static void mem_allocate(Sim *s, int32_t t) {
  EACH(s->starts, t, k) mem_add(s, &s->held[s->starts.item[k]]);
}

static void mem_release(Sim *s, int32_t t) {
  int32_t n_inputs = 0;
  EACH(s->releases, t, k) {
    Held *h = &s->held[s->releases.item[k]];
    if (--h->pending == 0) {
      if (s->releases.flag[k]) mem_remove(s, h);
      else { GROW(s->inputs, n_inputs, s->cap_inputs); s->inputs[n_inputs++] = s->releases.item[k]; }
    }
  }
  EACH(s->other_users, t, k) {
    Held *h = &s->held[s->other_users.item[k]];
    h->other_left--;
    free_if_unused(s, h);
  }
  EACH(s->ends, t, k) mem_add(s, &s->held[s->ends.item[k]]);
  for (int32_t k = 0; k < n_inputs; k++) mem_remove(s, &s->held[s->inputs[k]]);
}

static void mem_dispatched(Sim *s, int32_t t) {
  EACH(s->gpu_starts, t, k) mem_request(s, &s->held[s->gpu_starts.item[k]]);
}

static void mem_enqueued(Sim *s, int32_t t) {
  EACH(s->drops_first, t, k)
    dropped_by_host(s, &s->held[s->drops_first.item[k]], s->drops_first.flag[k]);
  EACH(s->gpu_ends, t, k) mem_request(s, &s->held[s->gpu_ends.item[k]]);
  EACH(s->drops_last, t, k)
    dropped_by_host(s, &s->held[s->drops_last.item[k]], s->drops_last.flag[k]);
}

/* ---- the lanes: engine.py's StreamLane (host thread and stream) and WorkerLane ------------ */
static void worker_push(Sim *s, Process *p, int32_t t) {
  GROW(p->heap, p->heap_n, p->heap_cap);
  int32_t i = p->heap_n++; /* tasks are numbered in their lane's order: the number is the key */
  while (i > 0 && p->heap[(i - 1) / 2] > t) { p->heap[i] = p->heap[(i - 1) / 2]; i = (i - 1) / 2; }
  p->heap[i] = t;
  if (s->events[p->wakeup].state == PENDING) succeed(s, p->wakeup);
}

static int32_t worker_pop(Process *p) {
  int32_t top = p->heap[0], last = p->heap[--p->heap_n], i = 0, n = p->heap_n;
  for (;;) {
    int32_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && p->heap[child + 1] < p->heap[child]) child++;
    if (p->heap[child] >= last) break;
    p->heap[i] = p->heap[child];
    i = child;
  }
  if (n) p->heap[i] = last;
  return top;
}

static void mark_ready(Sim *s, int32_t t) {
  int32_t worker = s->worker_of_lane[s->task_lane[t]];
  if (worker >= 0) worker_push(s, &s->procs[worker], t);
  else if (s->events[READY(t)].state == PENDING) succeed(s, READY(t));
}

/* A piece of work of solo_s seconds: on the shared resources where it draws on any (uses
 * off[shape] to off[shape + 1]), else a timeout; the event to wait for, or -1 for none. */
static int32_t work(Sim *s, double solo_s, const int32_t *off, const int32_t *res,
                    const double *demand, int32_t shape, double share, int32_t tag) {
  if (!(solo_s > 0)) return -1;
  int32_t first = off[shape], n = off[shape + 1] - first;
  if (n) return share_run(s, solo_s, res + first, demand + first, n, share, tag);
  return timeout(s, solo_s);
}

/* execute's start: its buffers, then its work */
static int32_t task_starts(Sim *s, int32_t t, int on_stream) {
  const SimInput *in = s->in;
  int32_t shape = in->task_shape[t];
  s->out->start_s[t] = s->now;
  if (!on_stream) mem_dispatched(s, t);
  mem_allocate(s, t);
  return work(s, in->solo_s[shape], in->use_off, in->use_res, in->use_demand, shape,
              in->share[shape], in->tag[shape]);
}

/* execute's end: its buffers, then its successors' readiness */
static void task_ends(Sim *s, int32_t t, int on_stream) {
  s->out->end_s[t] = s->now;
  if (on_stream) succeed(s, FINISHED(t));
  else { succeed(s, ENQUEUED(t)); mem_enqueued(s, t); }
  mem_release(s, t);
  for (int32_t k = s->in->succ_off[t]; k < s->in->succ_off[t + 1]; k++) {
    int32_t u = s->in->succ[k];
    if (--s->waiting_on[u] == 0) mark_ready(s, u);
  }
}

/* the host thread begins enqueueing the task: its requests, then its launches */
static int32_t dispatch_starts(Sim *s, int32_t t) {
  const SimInput *in = s->in;
  int32_t shape = in->task_shape[t];
  succeed(s, DISPATCHED(t));
  mem_dispatched(s, t);
  return work(s, in->dispatch_s[shape], in->duse_off, in->duse_res, in->duse_demand, shape,
              in->dispatch_share[shape], 0 /* the tag "" */);
}

/* Each process runs from where it last waited (pc) until it must wait again: `wait_for`
 * registers its resumption on an event not yet processed. Processes never move in memory. */
static void host_thread(Sim *s, Process *p, int32_t pi) {
  const SimInput *in = s->in;
  for (;;) {
    int32_t t = in->lane_start[p->lane] + p->i, ev;
    switch (p->pc) {
    case 0:
      if (p->i >= p->count) return;
      p->pc = 1;
      if (in->run_ahead && p->i >= in->run_ahead && wait_for(s, pi, FINISHED(t - in->run_ahead)))
        return;
      /* fall through */
    case 1: {
      int32_t lo = in->pred_off[t], count = in->pred_off[t + 1] - lo;
      ensure_scratch(s, count);
      for (int32_t k = 0; k < count; k++) s->scratch_idx[k] = ENQUEUED(in->pred[lo + k]);
      ev = all_of(s, s->scratch_idx, count);
      p->pc = 2;
      if (wait_for(s, pi, ev)) return;
    } /* fall through */
    case 2:
      ev = dispatch_starts(s, t);
      p->pc = 3;
      if (ev >= 0 && wait_for(s, pi, ev)) return;
      /* fall through */
    case 3:
      succeed(s, ENQUEUED(t));
      mem_enqueued(s, t);
      p->i++;
      p->pc = 0;
    }
  }
}

static void stream(Sim *s, Process *p, int32_t pi) {
  for (;;) {
    int32_t t = s->in->lane_start[p->lane] + p->i, ev;
    switch (p->pc) {
    case 0: {
      if (p->i >= p->count) return;
      int32_t both[2] = {READY(t), DISPATCHED(t)};
      ev = all_of(s, both, 2);
      p->pc = 1;
      if (wait_for(s, pi, ev)) return;
    } /* fall through */
    case 1:
      ev = task_starts(s, t, 1);
      p->pc = 2;
      if (ev >= 0 && wait_for(s, pi, ev)) return;
      /* fall through */
    case 2:
      p->pc = 3;
      if (s->events[ENQUEUED(t)].state == PENDING && wait_for(s, pi, ENQUEUED(t))) return;
      /* fall through */
    case 3:
      task_ends(s, t, 1);
      p->i++;
      p->pc = 0;
    }
  }
}

static void worker(Sim *s, Process *p, int32_t pi) {
  for (;;) {
    int32_t ev;
    switch (p->pc) {
    case 0:
      if (p->i >= p->count) return;
      /* fall through */
    case 1:
      if (!p->heap_n) {
        p->wakeup = new_event(s);
        p->pc = 1;
        wait_for(s, pi, p->wakeup);
        return;
      }
      p->task = worker_pop(p);
      s->ran[s->in->lane_start[p->lane] + s->ran_n[p->lane]++] = p->task;
      ev = task_starts(s, p->task, 0);
      p->pc = 2;
      if (ev >= 0 && wait_for(s, pi, ev)) return;
      /* fall through */
    case 2:
      task_ends(s, p->task, 0);
      p->i++;
      p->pc = 0;
    }
  }
}

static void resume(Sim *s, int32_t pi) {
  Process *p = &s->procs[pi];
  switch (p->type) {
  case HOST_THREAD: host_thread(s, p, pi); break;
  case STREAM: stream(s, p, pi); break;
  default: worker(s, p, pi);
  }
}

static void start_process(Sim *s, int32_t type, int32_t lane) {
  int32_t pi = s->n_procs++;
  Process *p = &s->procs[pi];
  memset(p, 0, sizeof *p);
  p->type = type; p->lane = lane; p->wakeup = -1;
  p->count = s->in->lane_start[lane + 1] - s->in->lane_start[lane];
  int32_t start = new_event(s);
  add_callback(s, start, CB_RESUME, pi);
  schedule(s, start, s->now, URGENT);
}

/* ---- setting up: the ledger's per-task lists, the run's processes ------------------------- */
enum { L_STARTS, L_ENDS, L_RELEASES, L_GPU_STARTS, L_GPU_ENDS, L_DROPS_FIRST, L_DROPS_LAST,
       L_OTHER_USERS, N_LISTS };

/* pass 0 counts each task's items, pass 1 files them, in the ledger's order */
static void file_buffers(Sim *s, Lists *lists, int pass, int32_t *cursor) {
  const SimInput *in = s->in;
#define FILE_ITEM(which, task, b, f)                                                          \
  do {                                                                                        \
    int32_t at_ = (which) * (in->n_tasks + 1) + (task);                                       \
    if (pass == 0) cursor[at_]++;                                                             \
    else { int32_t k_ = cursor[at_]++; lists[which].item[k_] = (b);                          \
           lists[which].flag[k_] = (int8_t)(f); }                                             \
  } while (0)
  for (int32_t b = 0; b < in->n_buffers; b++) {
    int32_t alloc = in->buf_alloc_task[b], gpu = in->buf_tier[b] == in->gpu_tier;
    Held *h = &s->held[b];
    if (alloc >= 0) {
      FILE_ITEM(in->buf_at_end[b] ? L_ENDS : L_STARTS, alloc, b, 0);
      if (gpu) FILE_ITEM(in->buf_at_end[b] ? L_GPU_ENDS : L_GPU_STARTS, alloc, b, 0);
    }
    for (int32_t k = in->rel_off[b]; k < in->rel_off[b + 1]; k++) {
      int32_t t = in->rel_task[k];
      int before = alloc == t && !in->buf_outlives[b];
      FILE_ITEM(L_RELEASES, t, b, before);
      if (!gpu) continue;
      int own = h->pool == 1 + s->task_lane[t];
      FILE_ITEM(before ? L_DROPS_FIRST : L_DROPS_LAST, t, b, own);
      if (!own) FILE_ITEM(L_OTHER_USERS, t, b, 0);
      if (pass == 0) continue;
      h->host_left++;
      if (own) h->own_left++;
      else h->other_left++;
    }
  }
#undef FILE_ITEM
}

static void set_up_memory(Sim *s) {
  const SimInput *in = s->in;
  int32_t n = in->n_tasks, stride = n + 1;
  s->held = must_calloc((size_t)in->n_buffers + 1, sizeof(Held));
  for (int32_t b = 0; b < in->n_buffers; b++) {
    Held *h = &s->held[b];
    h->tier = in->buf_tier[b]; h->bytes = in->buf_bytes[b];
    h->pool = in->buf_alloc_task[b] < 0 ? 0 : 1 + s->task_lane[in->buf_alloc_task[b]];
    h->pending = in->rel_off[b + 1] - in->rel_off[b];
  }
  int32_t *cursor = must_calloc((size_t)N_LISTS * stride, sizeof(int32_t));
  Lists *lists[N_LISTS] = {&s->starts, &s->ends, &s->releases, &s->gpu_starts, &s->gpu_ends,
                           &s->drops_first, &s->drops_last, &s->other_users};
  Lists all[N_LISTS];
  file_buffers(s, all, 0, cursor);
  for (int w = 0; w < N_LISTS; w++) {
    int32_t *off = must_malloc((size_t)(stride + 1) * sizeof(int32_t)), total = 0;
    for (int32_t t = 0; t < n; t++) {
      off[t] = total;
      total += cursor[w * stride + t];
      cursor[w * stride + t] = off[t];
    }
    off[n] = total;
    all[w].off = off;
    all[w].item = must_malloc((size_t)(total + 1) * sizeof(int32_t));
    all[w].flag = must_malloc((size_t)(total + 1));
  }
  file_buffers(s, all, 1, cursor);
  for (int w = 0; w < N_LISTS; w++) *lists[w] = all[w];
  free(cursor);
  /* held before the plan runs: in use from the start, static GPU blocks requested */
  for (int32_t b = 0; b < in->n_buffers; b++) {
    if (in->buf_alloc_task[b] >= 0) continue;
    Held *h = &s->held[b];
    s->in_use[h->tier] += h->bytes;
    if (h->tier == in->gpu_tier) {
      pool_add(s, 0, h->bytes);
      if (b != in->runtime_buffer) mem_request(s, h);
    }
  }
  for (int32_t tier = 0; tier < in->n_tiers; tier++)
    s->out->peak[tier] = s->out->static_in_use[tier] = s->in_use[tier];
}

static void free_all(Sim *s) {
  Lists *lists[N_LISTS] = {&s->starts, &s->ends, &s->releases, &s->gpu_starts, &s->gpu_ends,
                           &s->drops_first, &s->drops_last, &s->other_users};
  for (int w = 0; w < N_LISTS; w++) { free(lists[w]->off); free(lists[w]->item); free(lists[w]->flag); }
  for (int32_t g = 0; g < s->n_segments; g++) free(s->segments[g].blocks);
  for (int32_t l = 0; l < s->in->n_lanes; l++)
    if (s->worker_of_lane[l] >= 0) free(s->procs[s->worker_of_lane[l]].heap);
  for (int32_t r = 0; r < s->in->n_resources; r++) free(s->members[r]);
  void *arrays[] = {s->events, s->cbs, s->queue, s->procs, s->task_lane, s->waiting_on,
                    s->worker_of_lane, s->ran, s->ran_n, s->flows, s->limits, s->active,
                    s->members, s->n_members, s->cap_members, s->is_short, s->scratch_idx,
                    s->scratch_f, s->scratch_d, s->scratch_w, s->changed, s->held, s->in_use,
                    s->pool_in_use, s->segments, s->inputs};
  for (size_t k = 0; k < sizeof arrays / sizeof *arrays; k++) free(arrays[k]);
}

/* Run the plan to its end; 0, or a status for a state the Python engine raises on. */
int simulate_untraced(const SimInput *in, SimOutput *out) {
  if (in->n_resources > 64 || in->run_ahead < 0) return ERR_STATE;
  Sim sim = {0}, *s = &sim;
  s->in = in; s->out = out; s->timer = -1;
  int32_t n = in->n_tasks, lanes = in->n_lanes;
  s->task_lane = must_malloc((size_t)(n + 1) * sizeof(int32_t));
  s->waiting_on = must_malloc((size_t)(n + 1) * sizeof(int32_t));
  s->ran = must_malloc((size_t)(n + 1) * sizeof(int32_t));
  s->ran_n = must_calloc((size_t)lanes + 1, sizeof(int32_t));
  s->worker_of_lane = must_malloc((size_t)(lanes + 1) * sizeof(int32_t));
  s->procs = must_malloc((size_t)(3 * lanes + 1) * sizeof(Process)); /* never moves */
  s->members = must_calloc((size_t)in->n_resources + 1, sizeof(Member *));
  s->n_members = must_calloc((size_t)in->n_resources + 1, sizeof(int32_t));
  s->cap_members = must_calloc((size_t)in->n_resources + 1, sizeof(int32_t));
  s->is_short = must_calloc((size_t)in->n_resources + 1, 1);
  s->in_use = must_calloc((size_t)in->n_tiers + 1, sizeof(int64_t));
  s->pool_in_use = must_calloc((size_t)lanes + 2, sizeof(int64_t));
  for (int32_t p = 0; p <= lanes; p++) out->pool_peak_rank[p] = out->pool_reserved_rank[p] = -1;
  *out->held_peak = 0;
  for (int32_t l = 0; l < lanes; l++)
    for (int32_t t = in->lane_start[l]; t < in->lane_start[l + 1]; t++) s->task_lane[t] = l;
  for (int32_t t = 0; t < n; t++) {
    s->waiting_on[t] = in->pred_off[t + 1] - in->pred_off[t];
    out->end_s[t] = NAN;
  }
  set_up_memory(s);
  for (int32_t t = 0; t < 4 * n; t++) new_event(s);
  for (int32_t t = 0; t < n; t++)
    if (s->waiting_on[t] == 0 && in->lane_strict[s->task_lane[t]]) succeed(s, READY(t));
  /* the workers and their wake-ups; then their first ready tasks */
  int32_t workers_at = 0;
  for (int32_t l = 0; l < lanes; l++) {
    s->worker_of_lane[l] = -1;
    if (in->lane_strict[l]) continue;
    Process *p = &s->procs[2 * lanes + workers_at];
    memset(p, 0, sizeof *p);
    p->type = WORKER; p->lane = l; p->count = in->lane_start[l + 1] - in->lane_start[l];
    p->wakeup = new_event(s);
    s->worker_of_lane[l] = 2 * lanes + workers_at++;
  }
  for (int32_t t = 0; t < n; t++)
    if (s->waiting_on[t] == 0 && !in->lane_strict[s->task_lane[t]])
      worker_push(s, &s->procs[s->worker_of_lane[s->task_lane[t]]], t);
  /* processes start in lane order: a stream's host thread, then the stream; a worker (laid
   * out above, after the streams' 2 * lanes slots) */
  for (int32_t l = 0; l < lanes; l++) {
    if (in->lane_start[l + 1] == in->lane_start[l]) continue;
    if (in->lane_strict[l]) {
      start_process(s, HOST_THREAD, l);
      start_process(s, STREAM, l);
    } else {
      int32_t pi = s->worker_of_lane[l];
      int32_t start = new_event(s);
      add_callback(s, start, CB_RESUME, pi);
      schedule(s, start, s->now, URGENT);
    }
  }
  while (s->n_queue && !s->error) {
    Scheduled item = pop_queue(s);
    s->now = item.t;
    s->events[item.event].state = PROCESSED;
    for (int32_t c = s->events[item.event].head; c >= 0 && !s->error; c = s->cbs[c].next) {
      Callback cb = s->cbs[c];
      if (cb.type == CB_RESUME) resume(s, cb.arg);
      else if (cb.type == CB_ALLOF) allof_check(s, cb.arg);
      else on_timer(s, item.event);
    }
  }
  for (int32_t t = 0; t < n && !s->error; t++)
    if (isnan(out->end_s[t])) s->error = ERR_STALLED;
  for (int32_t l = 0; l < lanes && !s->error; l++)
    for (int32_t t = in->lane_start[l]; t < in->lane_start[l + 1]; t++) {
      int32_t ran = in->lane_strict[l] ? t : s->ran[t];
      out->ran[t] = ran;
      out->span_start[t] = out->start_s[ran];
      out->span_end[t] = out->end_s[ran];
    }
  for (int32_t g = 0; g < s->n_segments; g++)
    out->pool_reserved[s->segments[g].pool] += s->segments[g].mapped;
  int error = s->error;
  free_all(s);
  return error;
}
