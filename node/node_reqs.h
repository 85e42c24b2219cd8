/* The node's request lists: singly linked FIFOs of struct node_req (node.h),
 * which the node owns from node_submit until the request's callback. Loop
 * thread only. Lists are only ever changed through node__list_push and
 * node__list_pop (a list rebuilt keeps its order: pop everything, push back
 * what stays), so head, tail and count agree, which node_check.c checks
 * after each turn. Header-only: the hot path pays no call. */
#ifndef TK_NODE_NODE_REQS_H
#define TK_NODE_NODE_REQS_H

#include <stddef.h>
#include <stdint.h>

#include "node/node.h"

struct req_list {
    struct node_req *head;
    struct node_req *tail;
    size_t n;
};

/* Requests waiting, each list in index (or arrival) order. */
struct node_requests {
    struct req_list applied_wait;   /* writes, applied mode */
    struct req_list committed_wait; /* writes, committed mode */
    struct req_list read_wait;      /* reads waiting for a read index */
    struct req_list read_ready;     /* reads with an index, waiting to apply */
    uint64_t read_ctx;
    uint64_t read_leader; /* the leader known when read_wait was last checked */
};

static inline void node__list_push(struct req_list *l, struct node_req *r)
{
    r->next = NULL;
    if (l->tail)
        l->tail->next = r;
    else
        l->head = r;
    l->tail = r;
    l->n++;
}

static inline struct node_req *node__list_pop(struct req_list *l)
{
    struct node_req *r = l->head;
    if (r == NULL)
        return NULL;
    l->head = r->next;
    if (l->head == NULL)
        l->tail = NULL;
    l->n--;
    r->next = NULL;
    return r;
}

#endif
