/* The ring: the hot tier, a log of records in memory pages.
 *
 * Records are appended at the tail page; when a record does not fit, the tail
 * is sealed and a new page is opened (a record larger than a page gets a page
 * of its own size, so large values need no special path). The sm may rewrite a
 * key's newest record in place with a value of the same length
 * (kv__ring_rewrite). Pages leave from the head, oldest first, after
 * tier-down has copied what changed to the cold tier.
 * An address is (slot << 28 | offset): slots are reused once their page is
 * released, and the index drops every entry into a page before it goes.
 * Every read path calls kv__ring_check: bounds, magic, CRC32C; a damaged record
 * is treated as absent by the sm. Owner thread only. */
#include <string.h>
#include <sys/mman.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/crc32c.h"
#include "kv/kv_internal.h"

#if defined(__x86_64__)
#include <nmmintrin.h>

/* CRC32C of a short buffer with the SSE4.2 instruction, inline: a ring record
 * is mostly tens of bytes, where a call into ISA-L's folding code costs more
 * than the CRC itself. Same result as tk_crc32c(0, p, n). */
__attribute__((target("sse4.2"))) static uint32_t crc_short_hw(const uint8_t *p, size_t n)
{
    uint64_t c = 0xffffffffu;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n > 0; n--, p++)
        c32 = _mm_crc32_u8(c32, *p);
    return ~c32;
}
#endif

#define CRC_SHORT_MAX 256

/* The record CRC: tk_crc32c(0, p, n), computed inline for short records. */
static uint32_t rec_crc(const uint8_t *p, size_t n)
{
#if defined(__x86_64__)
    if (n <= CRC_SHORT_MAX && __builtin_cpu_supports("sse4.2"))
        return crc_short_hw(p, n);
#endif
    return tk_crc32c(0, p, n);
}

uint32_t kv__rec_crc(const void *p, size_t n)
{
    return rec_crc(p, n);
}

void kv__ring_init(struct kv_ring *r, size_t page_bytes)
{
    memset(r, 0, sizeof(*r));
    r->page_bytes = page_bytes;
}

#define HUGE_BYTES ((size_t)2 << 20)
#define SLAB_BYTES ((size_t)16 << 20)

void kv__ring_free(struct kv_ring *r)
{
    struct kv_page *p = r->head;
    while (p != NULL) {
        struct kv_page *next = p->next;
        if (!p->from_slab)
            tk_blob_unref(p->raw);
        p = next;
    }
    p = r->free_pages;
    while (p != NULL) {
        struct kv_page *next = p->next;
        if (!p->from_slab)
            tk_blob_unref(p->raw);
        p = next;
    }
    for (size_t i = 0; i < r->n_slabs; i++)
        kv__unmap(r->slabs[i], SLAB_BYTES);
    tk_free(r->slabs);
    tk_free(r->slots);
    tk_free(r->free_slots);
    memset(r, 0, sizeof(*r));
}

static uint32_t slot_take(struct kv_ring *r)
{
    if (r->n_free > 0)
        return r->free_slots[--r->n_free];
    TK_ASSERT(r->n_slots < (1u << KV_ADDR_SLOT_BITS));
    uint32_t n = r->n_slots == 0 ? 64 : r->n_slots * 2;
    if (n > (1u << KV_ADDR_SLOT_BITS))
        n = 1u << KV_ADDR_SLOT_BITS;
    r->slots = tk_realloc(r->slots, n * sizeof(*r->slots));
    r->free_slots = tk_realloc(r->free_slots, n * sizeof(*r->free_slots));
    for (uint32_t i = n; i > r->n_slots + 1; i--)
        r->free_slots[r->n_free++] = i - 1;
    uint32_t s = r->n_slots;
    for (uint32_t i = r->n_slots; i < n; i++)
        r->slots[i] = NULL;
    r->n_slots = n;
    return s;
}

/* A standard page carved from the current slab (a new slab when it is used
 * up). Slabs are 2 MiB aligned and advised onto transparent huge pages, so
 * random reads of the ring take fewer TLB misses. */
static struct kv_page *slab_page(struct kv_ring *r)
{
    size_t size = (sizeof(struct kv_page) + r->page_bytes + 63) & ~(size_t)63;
    if (r->slab_next == NULL || (size_t)(r->slab_end - r->slab_next) < size) {
        uint8_t *base = kv__map(SLAB_BYTES, HUGE_BYTES);
        r->slabs = tk_realloc(r->slabs, (r->n_slabs + 1) * sizeof(*r->slabs));
        r->slabs[r->n_slabs++] = base;
        madvise(base, SLAB_BYTES, MADV_HUGEPAGE);
        r->slab_next = base;
        r->slab_end = base + SLAB_BYTES;
    }
    struct kv_page *p = (struct kv_page *)(void *)r->slab_next;
    r->slab_next += size;
    return p;
}

static struct kv_page *page_new(struct kv_ring *r, size_t need)
{
    size_t cap = need > r->page_bytes ? need : r->page_bytes;
    TK_ASSERT(cap < (1u << KV_ADDR_OFF_BITS));
    struct kv_page *p;
    bool from_slab = false;
    struct tk_blob *raw = NULL;
    if (cap == r->page_bytes && r->free_pages != NULL) {
        p = r->free_pages;
        r->free_pages = p->next;
        r->free_bytes -= cap;
        if (p->from_slab && !p->forgotten)
            r->free_resident -= cap;
        from_slab = p->from_slab;
        raw = p->raw;
    } else if (cap == r->page_bytes && r->page_bytes <= HUGE_BYTES) {
        p = slab_page(r);
        from_slab = true;
    } else {
        /* Cache-line aligned like a slab page, so records keep their lines.
         * A blob: base keeps freed big ones, their pages backed already (a
         * 1 MB value's page was 256 page faults on every write). */
        raw = tk_blob_new(sizeof(*p) + cap + 63);
        p = (struct kv_page *)(((uintptr_t)raw->data + 63) & ~(uintptr_t)63);
    }
    memset(p, 0, sizeof(*p));
    p->raw = raw;
    p->from_slab = from_slab;
    p->cap = (uint32_t)cap;
    p->slot = slot_take(r);
    r->slots[p->slot] = p;
    if (r->tail != NULL) {
        r->tail->sealed = true;
        r->tail->next = p;
    } else {
        r->head = p;
    }
    r->tail = p;
    p->pos = r->next_pos;
    r->next_pos += cap;
    r->bytes += cap;
    r->n_pages++;
    return p;
}

uint64_t kv__ring_append(struct kv_ring *r, const struct kv_rec *h, const void *key,
                         const void *value)
{
    size_t size = kv__rec_size(h->key_len, h->value_len);
    struct kv_page *p = r->tail;
    if (p == NULL || p->sealed || p->cap - p->used < size)
        p = page_new(r, size);
    size_t off = p->used;
    struct kv_rec *rec = (struct kv_rec *)(void *)(p->data + off);
    *rec = *h;
    rec->magic = KV_REC_MAGIC;
    rec->pad = 0;
    uint8_t *kp = (uint8_t *)(rec + 1);
    if (h->key_len > 0)
        memcpy(kp, key, h->key_len);
    if (h->value_len > 0)
        memcpy(kp + h->key_len, value, h->value_len);
    size_t body = sizeof(*rec) + h->key_len + h->value_len;
    if (size > body)
        memset(p->data + off + body, 0, size - body);
    rec->crc = rec_crc((const uint8_t *)rec + KV_REC_CRC_FROM, body - KV_REC_CRC_FROM);
    p->used += (uint32_t)size;
    return kv__ring_addr(p, off);
}

void kv__ring_rewrite(struct kv_ring *r, uint64_t addr, const struct kv_rec *h,
                      const void *value)
{
    struct kv_page *p = kv__ring_page(r, addr);
    struct kv_rec *rec =
        (struct kv_rec *)(void *)(p->data + (addr & ((1u << KV_ADDR_OFF_BITS) - 1)));
    rec->expire_ms = h->expire_ms;
    rec->mod_rev = h->mod_rev;
    rec->create_rev = h->create_rev;
    rec->version = h->version;
    uint8_t *dst = (uint8_t *)(rec + 1) + rec->key_len;
    if (rec->value_len > 0 && dst != value) /* a put keeping its value: in place */
        memcpy(dst, value, rec->value_len);
    size_t body = sizeof(*rec) + rec->key_len + rec->value_len;
    rec->crc = rec_crc((const uint8_t *)rec + KV_REC_CRC_FROM, body - KV_REC_CRC_FROM);
}

bool kv__ring_check(const struct kv_ring *r, uint64_t addr)
{
    uint64_t slot = addr >> KV_ADDR_OFF_BITS;
    size_t off = addr & ((1u << KV_ADDR_OFF_BITS) - 1);
    if (slot >= r->n_slots || r->slots[slot] == NULL)
        return false;
    return kv__page_check(r->slots[slot], off);
}

bool kv__page_check(const struct kv_page *p, size_t off)
{
    if (off + sizeof(struct kv_rec) > p->used)
        return false;
    const struct kv_rec *h = (const struct kv_rec *)(const void *)(p->data + off);
    if (h->magic != KV_REC_MAGIC)
        return false;
    size_t body = sizeof(*h) + h->key_len + (size_t)h->value_len;
    if (off + body > p->used)
        return false;
    return rec_crc((const uint8_t *)h + KV_REC_CRC_FROM, body - KV_REC_CRC_FROM) ==
           h->crc;
}

void kv__ring_seal(struct kv_ring *r)
{
    if (r->tail != NULL)
        r->tail->sealed = true;
}

/* Gives a free slab page's memory back to the kernel (the whole 4 KiB pages
 * of its data; its header stays, on the free list); reused, it faults back
 * in as zeros, which page_new and appends do not mind. A ring that went over
 * its budget once (up to twice it while a tier-down job runs) so does not
 * hold that memory for good. */
static void page_forget(struct kv_page *p)
{
    uintptr_t a = ((uintptr_t)p->data + 4095) & ~(uintptr_t)4095;
    uintptr_t b = ((uintptr_t)p->data + p->cap) & ~(uintptr_t)4095;
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_DONTNEED);
    p->forgotten = true;
}

size_t kv__ring_forget_step(struct kv_ring *r, size_t max_pages)
{
    size_t n = 0;
    if (max_pages == 0 || r->bytes + r->free_resident <= r->keep_free_bytes)
        return 0;
    /* Keep the resident pages nearest the head (the next to be reused) up to
     * the keep; forget resident ones past them. */
    size_t room = r->keep_free_bytes > r->bytes ? r->keep_free_bytes - r->bytes : 0;
    size_t kept = 0;
    for (struct kv_page *p = r->free_pages; p != NULL && n < max_pages; p = p->next) {
        if (!p->from_slab || p->forgotten)
            continue;
        if (kept + p->cap <= room) {
            kept += p->cap;
            continue;
        }
        page_forget(p);
        r->free_resident -= p->cap;
        n++;
    }
    return n;
}

void kv__ring_release_head(struct kv_ring *r)
{
    struct kv_page *p = r->head;
    TK_ASSERT(p != NULL);
    TK_ASSERT(p->sealed);
    r->head = p->next;
    if (r->head == NULL)
        r->tail = NULL;
    r->slots[p->slot] = NULL;
    r->free_slots[r->n_free++] = p->slot;
    r->bytes -= p->cap;
    r->n_pages--;
    if (p->from_slab)
        r->free_resident += p->cap; /* kv__ring_forget_step trims it */
    if (p->from_slab || (p->cap == r->page_bytes &&
                         r->bytes + r->free_bytes + p->cap <= r->keep_free_bytes)) {
        p->next = r->free_pages;
        r->free_pages = p;
        r->free_bytes += p->cap;
    } else {
        tk_blob_unref(p->raw);
    }
}
