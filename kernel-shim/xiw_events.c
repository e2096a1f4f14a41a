// SPDX-License-Identifier: GPL-2.0
/*
 * xiw: the events page of a context. The provider maps it; the callbacks of
 * its QPs' sockets mark what happened there (data, room to send, the end),
 * so the provider learns of it without a system call, and its progress
 * thread is woken (the context's eventfd) only while it sleeps. The module
 * only ever writes the page at indices it chose itself; what the provider
 * writes there (armed, hint) is read as a yes or no.
 */

#include <linux/module.h>
#include <linux/vmalloc.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#define UVERBS_MODULE_NAME xiw_ib
#include <rdma/uverbs_named_ioctl.h>

#include "xiw.h"

static uint event_delay_us = 50;
module_param(event_delay_us, uint, 0644);
MODULE_PARM_DESC(event_delay_us,
		 "How long a QP whose events the application's own polling took last may wait before the provider's progress thread is woken (0: at once)");

static uint app_event_delay_us = 1000;
module_param(app_event_delay_us, uint, 0644);
MODULE_PARM_DESC(app_event_delay_us,
		 "How long a QP whose message the module woke the application's completion channel for may wait before the provider's progress thread is woken to read it (0: at once)");

struct xiw_mmap_entry {
	struct rdma_user_mmap_entry rdma;
	void *addr;
	/* A ring: on its context's list, its bytes counted in xiw_ring_bytes. */
	struct list_head ring;
	size_t ring_len;
};

/* The rings of every context, at most a quarter of the memory. */
static atomic64_t xiw_ring_bytes = ATOMIC64_INIT(0);

static struct xiw_events_header *xiw_events_hdr(struct xiw_ucontext *uctx)
{
	return uctx->events;
}

static struct xiw_events_slot *xiw_events_slot(struct xiw_ucontext *uctx,
					       u32 slot)
{
	return (struct xiw_events_slot *)((u8 *)uctx->events +
					  XIW_EVENTS_SLOTS_OFFSET) + slot;
}

/* Makes the context's events page; the provider learns where from `resp`. */
int xiw_events_alloc(struct xiw_ucontext *uctx,
		     struct xiw_alloc_ucontext_resp *resp)
{
	size_t len = PAGE_ALIGN(XIW_EVENTS_BYTES);
	struct xiw_events_header *hdr;
	struct xiw_mmap_entry *e;
	int rv;

	e = kzalloc(sizeof(*e), GFP_KERNEL);
	if (!e)
		return -ENOMEM;
	e->addr = vmalloc_user(len);
	if (!e->addr) {
		kfree(e);
		return -ENOMEM;
	}
	hdr = e->addr;
	hdr->magic = XIW_EVENTS_MAGIC;
	hdr->version = XIW_EVENTS_VERSION;
	hdr->slots = XIW_EVENTS_SLOTS;
	rv = rdma_user_mmap_entry_insert(&uctx->base, &e->rdma, len);
	if (rv) {
		vfree(e->addr);
		kfree(e);
		return rv;
	}
	uctx->events = e->addr;
	uctx->ev_entry = &e->rdma;
	resp->events_offset = rdma_user_mmap_get_offset(&e->rdma);
	resp->events_len = len;
	return 0;
}

/* The context goes; the page is freed once the provider's mapping is gone. */
void xiw_events_free(struct xiw_ucontext *uctx)
{
	if (uctx->ev_entry)
		rdma_user_mmap_entry_remove(uctx->ev_entry);
	uctx->ev_entry = NULL;
	uctx->events = NULL;
	ida_destroy(&uctx->ev_ida);
}

int xiw_mmap(struct ib_ucontext *ibuctx, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *rdma = rdma_user_mmap_entry_get(ibuctx, vma);
	struct xiw_mmap_entry *e;
	int rv;

	if (!rdma)
		return -EINVAL;
	e = container_of(rdma, struct xiw_mmap_entry, rdma);
	rv = remap_vmalloc_range(vma, e->addr, 0);
	rdma_user_mmap_entry_put(rdma);
	return rv;
}

void xiw_mmap_free(struct rdma_user_mmap_entry *rdma)
{
	struct xiw_mmap_entry *e = container_of(rdma, struct xiw_mmap_entry, rdma);

	vfree(e->addr);
	atomic64_sub(e->ring_len, &xiw_ring_bytes);
	kfree(e);
}

void xiw_rings_init(struct xiw_ucontext *uctx)
{
	mutex_init(&uctx->rings_lock);
	INIT_LIST_HEAD(&uctx->rings);
	uctx->nr_rings = 0;
}

/* The context goes: so do its rings (once no mapping holds them). */
void xiw_rings_free(struct xiw_ucontext *uctx)
{
	struct xiw_mmap_entry *e, *next;

	mutex_lock(&uctx->rings_lock);
	list_for_each_entry_safe(e, next, &uctx->rings, ring) {
		list_del(&e->ring);
		rdma_user_mmap_entry_remove(&e->rdma);
	}
	uctx->nr_rings = 0;
	mutex_unlock(&uctx->rings_lock);
	mutex_destroy(&uctx->rings_lock);
}

/* The caller's context and the u64 it passed as attribute `attr`. */
static struct xiw_ucontext *xiw_ring_call(struct uverbs_attr_bundle *attrs,
					  u16 attr, u64 *val)
{
	struct ib_ucontext *ibuctx = ib_uverbs_get_ucontext(attrs);
	int rv;

	if (IS_ERR(ibuctx))
		return ERR_CAST(ibuctx);
	rv = uverbs_get_const(val, attrs, attr);
	if (rv)
		return ERR_PTR(rv);
	return container_of(ibuctx, struct xiw_ucontext, base);
}

/*
 * Zeroed memory for a ring of the context's provider, mapped by it from the
 * command fd at the offset returned. Bounded per context and in all.
 */
static int UVERBS_HANDLER(XIW_METHOD_RING_ALLOC)(struct uverbs_attr_bundle *attrs)
{
	struct xiw_ucontext *uctx;
	struct xiw_mmap_entry *e;
	u64 len, off;
	int rv;

	uctx = xiw_ring_call(attrs, XIW_ATTR_RING_LEN, &len);
	if (IS_ERR(uctx))
		return PTR_ERR(uctx);
	if (!len || len > XIW_RING_MAX_BYTES)
		return -EINVAL;
	len = PAGE_ALIGN(len);
	if (atomic64_add_return(len, &xiw_ring_bytes) >
	    (s64)(totalram_pages() << PAGE_SHIFT) / 4) {
		atomic64_sub(len, &xiw_ring_bytes);
		return -ENOMEM;
	}
	e = kzalloc(sizeof(*e), GFP_KERNEL);
	if (!e)
		goto nomem;
	e->ring_len = len;
	e->addr = vmalloc_user(len);
	if (!e->addr)
		goto nomem_e;
	mutex_lock(&uctx->rings_lock);
	rv = -ENOMEM;
	if (uctx->nr_rings >= XIW_RINGS_PER_CONTEXT)
		goto unlock;
	rv = rdma_user_mmap_entry_insert(&uctx->base, &e->rdma, len);
	if (rv)
		goto unlock;
	list_add(&e->ring, &uctx->rings);
	uctx->nr_rings++;
	off = rdma_user_mmap_get_offset(&e->rdma);
	rv = uverbs_copy_to(attrs, XIW_ATTR_RING_OFFSET, &off, sizeof(off));
	if (rv) {
		list_del(&e->ring);
		uctx->nr_rings--;
		/* Frees it (and uncounts it) through xiw_mmap_free. */
		rdma_user_mmap_entry_remove(&e->rdma);
	}
	mutex_unlock(&uctx->rings_lock);
	return rv;
unlock:
	mutex_unlock(&uctx->rings_lock);
	vfree(e->addr);
	kfree(e);
	atomic64_sub(len, &xiw_ring_bytes);
	return rv;
nomem_e:
	kfree(e);
nomem:
	atomic64_sub(len, &xiw_ring_bytes);
	return -ENOMEM;
}

/* The provider is done with a ring of its context (named by its offset). */
static int UVERBS_HANDLER(XIW_METHOD_RING_FREE)(struct uverbs_attr_bundle *attrs)
{
	struct xiw_mmap_entry *e, *found = NULL;
	struct xiw_ucontext *uctx;
	u64 off;

	uctx = xiw_ring_call(attrs, XIW_ATTR_RING_OFFSET, &off);
	if (IS_ERR(uctx))
		return PTR_ERR(uctx);
	mutex_lock(&uctx->rings_lock);
	list_for_each_entry(e, &uctx->rings, ring) {
		if (rdma_user_mmap_get_offset(&e->rdma) == off) {
			found = e;
			break;
		}
	}
	if (found) {
		list_del(&found->ring);
		uctx->nr_rings--;
		rdma_user_mmap_entry_remove(&found->rdma);
	}
	mutex_unlock(&uctx->rings_lock);
	return found ? 0 : -ENOENT;
}

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_RING_ALLOC,
			    UVERBS_ATTR_CONST_IN(XIW_ATTR_RING_LEN, u64,
						 UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(XIW_ATTR_RING_OFFSET,
						UVERBS_ATTR_TYPE(u64),
						UA_MANDATORY));

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_RING_FREE,
			    UVERBS_ATTR_CONST_IN(XIW_ATTR_RING_OFFSET, u64,
						 UA_MANDATORY));

ADD_UVERBS_METHODS(xiw_ring_methods, UVERBS_OBJECT_DEVICE,
		   &UVERBS_METHOD(XIW_METHOD_RING_ALLOC),
		   &UVERBS_METHOD(XIW_METHOD_RING_FREE));

const struct uapi_definition xiw_ring_uapi_defs[] = {
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_DEVICE, &xiw_ring_methods),
	{},
};

/*
 * The provider names the context's ring at `off` as the ring of `cq`:
 * the module may take its arm word from now on (xiw_cq_event()). The ring
 * before, if any, is let go once no reader can be looking at it.
 */
int xiw_cq_ring_set(struct xiw_ucontext *uctx, struct xiw_cq *cq, u64 off)
{
	struct rdma_user_mmap_entry *rdma, *old;
	struct xiw_mmap_entry *e, *found = NULL;

	if (off & ~PAGE_MASK)
		return -EINVAL;
	mutex_lock(&uctx->rings_lock);
	list_for_each_entry(e, &uctx->rings, ring) {
		if (rdma_user_mmap_get_offset(&e->rdma) == off) {
			found = e;
			break;
		}
	}
	rdma = found ? rdma_user_mmap_entry_get_pgoff(&uctx->base,
						      off >> PAGE_SHIFT) : NULL;
	if (!rdma || rdma != &found->rdma ||
	    found->ring_len < XIW_RING_SLOTS_OFFSET) {
		mutex_unlock(&uctx->rings_lock);
		if (rdma)
			rdma_user_mmap_entry_put(rdma);
		return -ENOENT;
	}
	old = cq->ring;
	cq->ring = rdma;
	rcu_assign_pointer(cq->arm,
			   &((struct xiw_ring_header *)found->addr)->arm);
	mutex_unlock(&uctx->rings_lock);
	if (old) {
		/* A reader of the old arm word is done before its memory goes. */
		synchronize_rcu();
		rdma_user_mmap_entry_put(old);
	}
	return 0;
}

/* The CQ goes (no QP uses it any more, so no stream looks at it). */
void xiw_cq_ring_put(struct xiw_cq *cq)
{
	RCU_INIT_POINTER(cq->arm, NULL);
	if (cq->ring)
		rdma_user_mmap_entry_put(cq->ring);
	cq->ring = NULL;
}

/*
 * A message that completes a receive of a QP whose receive CQ is `cq` is
 * whole in the socket, for the provider to process: if the application
 * armed the CQ for it (any completion; with `solicited`, a solicited one
 * too), the module takes the arm word, as the provider would on storing
 * the completion, and wakes the completion channel now, so that the woken
 * application's own poll reads the socket and finds the completion. True
 * if it did. The arm word is the provider's memory: a compare-and-swap
 * from a value the provider writes, nothing else. The message is counted
 * in the stream's slot (`ev`) before the channel is woken, so that the
 * woken application, arming again, knows its completion is owed.
 */
bool xiw_cq_event(struct ib_cq *cq, bool solicited, struct xiw_stream_ev *ev)
{
	struct xiw_cq *xcq = to_xcq(cq);
	bool fire = false;
	u32 *arm, v;

	rcu_read_lock();
	arm = rcu_dereference(xcq->arm);
	if (arm) {
		v = READ_ONCE(*arm);
		fire = (v == XIW_CQ_ARM_NEXT ||
			(v == XIW_CQ_ARM_SOLICITED && solicited)) &&
		       cmpxchg(arm, v, XIW_CQ_ARM_NONE) == v;
	}
	rcu_read_unlock();
	if (!fire)
		return false;
	xiw_stream_mark_for_app(ev, XIW_EV_DATA);
	if (cq->comp_handler)
		cq->comp_handler(cq, cq->cq_context);
	return true;
}

/* The slot of a stream whose events are marked (ev->uctx set). */
struct xiw_events_slot *xiw_stream_slot(struct xiw_stream_ev *ev)
{
	return xiw_events_slot(ev->uctx, ev->slot);
}

/* The stream's reader is the provider, its Write tally empty. */
void xiw_stream_place_reset(struct xiw_stream_ev *ev)
{
	struct xiw_events_slot *s = xiw_stream_slot(ev);

	WRITE_ONCE(s->place, XIW_PLACE_USER);
	WRITE_ONCE(s->flags, 0);
	WRITE_ONCE(s->write_len, 0);
	WRITE_ONCE(s->after_write, 0);
	WRITE_ONCE(s->hand_len, 0);
}

/* A slot for a new QP, clean; -1 if the context has no events page. */
int xiw_events_slot_get(struct xiw_ucontext *uctx)
{
	struct xiw_events_slot *s;
	int slot;

	if (!uctx || !uctx->events)
		return -1;
	slot = ida_alloc_max(&uctx->ev_ida, XIW_EVENTS_SLOTS - 1, GFP_KERNEL);
	if (slot < 0)
		return -1;
	s = xiw_events_slot(uctx, slot);
	WRITE_ONCE(s->events, 0);
	WRITE_ONCE(s->hint, XIW_EV_HINT_PROGRESS);
	WRITE_ONCE(s->place, XIW_PLACE_USER);
	return slot;
}

void xiw_events_slot_put(struct xiw_ucontext *uctx, int slot)
{
	if (uctx && uctx->events && slot >= 0)
		ida_free(&uctx->ev_ida, slot);
}

/* A connection waits for the provider (told before the eventfd is signalled). */
void xiw_events_note_cm(struct xiw_ucontext *uctx)
{
	if (!uctx->events)
		return;
	WRITE_ONCE(xiw_events_hdr(uctx)->cm, 1);
	/* Seen by the provider before the eventfd's count. */
	smp_wmb();
}

/* Wakes the provider's progress thread if it sleeps. */
static void xiw_events_wake(struct xiw_ucontext *uctx)
{
	struct xiw_events_header *hdr = xiw_events_hdr(uctx);

	if (READ_ONCE(hdr->armed) && xchg(&hdr->armed, 0) && uctx->cm_ev)
		xiw_eventfd_signal(uctx->cm_ev);
}

/*
 * Marks `bits` in the stream's slot. Called from the socket's callbacks
 * (softirq or process context), with the socket's callback lock read-held,
 * which keeps the stream's context and timer alive. With `app`, the
 * application was woken for a message among them (its completion channel),
 * which is counted in the slot (XIW_EV_SIGNALLED_ONE), and the progress
 * thread is woken only after app_event_delay_us if the application did not
 * take them: sooner, it would race the woken application for the bytes.
 */
static void xiw_stream_mark_as(struct xiw_stream_ev *ev, u32 bits, bool app)
{
	struct xiw_ucontext *uctx = ev->uctx;
	struct xiw_events_slot *s;
	u32 old, delay;

	if (!uctx)
		return;
	s = xiw_events_slot(uctx, ev->slot);
	old = READ_ONCE(s->events);
	do {
		/* A message signalled is counted, whatever was marked before. */
		if ((old & bits) == bits && !app)
			return;
	} while (!try_cmpxchg(&s->events, &old,
			      (old | bits) + (app ? XIW_EV_SIGNALLED_ONE : 0)));
	if (old & XIW_EV_MARKS)
		/*
		 * Marked before: the provider has yet to take that. A count of
		 * messages signalled alone is not a mark: the provider takes
		 * marks and counts apart, and what it left must not hide this.
		 */
		return;
	set_bit(ev->slot, (unsigned long *)((u8 *)uctx->events +
					    XIW_EVENTS_SUMMARY_OFFSET));
	WRITE_ONCE(xiw_events_hdr(uctx)->pending, 1);
	/* The marks before the look at `armed` (the provider: the reverse). */
	smp_mb();
	delay = app ? READ_ONCE(app_event_delay_us) :
		READ_ONCE(s->hint) == XIW_EV_HINT_APP ? READ_ONCE(event_delay_us) : 0;
	if (delay) {
		hrtimer_start(&ev->timer, ns_to_ktime(delay * 1000ull),
			      HRTIMER_MODE_REL_SOFT);
		return;
	}
	xiw_events_wake(uctx);
}

void xiw_stream_mark(struct xiw_stream_ev *ev, u32 bits)
{
	xiw_stream_mark_as(ev, bits, false);
}

void xiw_stream_mark_for_app(struct xiw_stream_ev *ev, u32 bits)
{
	xiw_stream_mark_as(ev, bits, true);
}

/* The delay is over: events nobody took wake the progress thread. */
static enum hrtimer_restart xiw_stream_timer(struct hrtimer *t)
{
	struct xiw_stream_ev *ev = container_of(t, struct xiw_stream_ev, timer);
	struct xiw_ucontext *uctx = READ_ONCE(ev->uctx);

	if (uctx && READ_ONCE(xiw_events_slot(uctx, ev->slot)->events))
		xiw_events_wake(uctx);
	return HRTIMER_NORESTART;
}

void xiw_stream_ev_init(struct xiw_stream_ev *ev)
{
	ev->uctx = NULL;
	ev->slot = 0;
	ev->pd = NULL;
	ev->crc = false;
	ev->rcq = NULL;
#ifdef XIW_HRTIMER_SETUP
	hrtimer_setup(&ev->timer, xiw_stream_timer, CLOCK_MONOTONIC,
		      HRTIMER_MODE_REL_SOFT);
#else
	hrtimer_init(&ev->timer, CLOCK_MONOTONIC, HRTIMER_MODE_REL_SOFT);
	ev->timer.function = xiw_stream_timer;
#endif
}

/*
 * The stream's events stop; the caller has taken the callbacks away. A
 * delayed wake-up that was due (the stream's end marked, say) is made now:
 * nothing else would wake the provider for those marks.
 */
void xiw_stream_ev_stop(struct xiw_stream_ev *ev)
{
	struct xiw_ucontext *uctx = ev->uctx;

	if (hrtimer_cancel(&ev->timer) && uctx &&
	    READ_ONCE(xiw_events_slot(uctx, ev->slot)->events))
		xiw_events_wake(uctx);
	WRITE_ONCE(ev->uctx, NULL);
}
