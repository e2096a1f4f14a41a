// SPDX-License-Identifier: GPL-2.0
/*
 * xiw: RDMA Writes placed straight from a stream's socket, in its receive
 * callback, as an RNIC's DMA places them, so that data reaches memory
 * without waking a thread.
 *
 * The provider lends the module a stream between its own reads (its QP's
 * events slot says so: XIW_PLACE_KERNEL), when it holds no byte of it and
 * is between two FPDUs. The module then takes whole FPDUs from the head of
 * the socket, and only clean RDMA Writes (xiw_fpdu.c) whose CRC, STag, PD,
 * rights and bounds check out against a region of the QP's PD that it has
 * pinned; the first FPDU it does not place stays in the socket, whole and in
 * order, and the stream goes back to the provider (XIW_PLACE_USER and a
 * mark), whose engine keeps every other decision and builds every
 * Terminate. The Write accounting Immediate Data needs travels with the
 * stream in the slot, and so may the provider's oldest outstanding Read
 * (XIW_PLACE_F_READ): its Read Responses are placed too, each where the Read's
 * data has reached, and the Read's last segment marks the stream for the
 * provider to complete it. A small FPDU left whole in the socket (a short Send,
 * say) goes up in the slot instead (XIW_PLACE_HANDED), its bytes as they
 * came, so that the provider reads no socket for it.
 *
 * A region is pinned at registration when the provider asks (one that may
 * be written), within the caller's locked-memory limit; one that cannot be
 * pinned is registered all the same and the provider places for it. A
 * region leaves the table when its STag is invalidated or it is
 * deregistered, and either waits for a placement into it under way.
 */

#include <linux/highmem.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/skbuff.h>
#include <net/tcp.h>
#include <rdma/uverbs_ioctl.h>

#define UVERBS_MODULE_NAME xiw_ib
#include <rdma/uverbs_named_ioctl.h>

#include "xiw.h"
#include "xiw_fpdu.h"

static bool kernel_place = true;
module_param(kernel_place, bool, 0644);
MODULE_PARM_DESC(kernel_place,
		 "place RDMA Writes and Read Responses from the socket of a stream the provider lends");

static bool direct_cq_event = true;
module_param(direct_cq_event, bool, 0644);
MODULE_PARM_DESC(direct_cq_event,
		 "wake an armed CQ's completion channel from the socket when a message completing a receive comes on a lent stream");

static bool hand_up = true;
module_param(hand_up, bool, 0644);
MODULE_PARM_DESC(hand_up,
		 "hand a small FPDU the module does not place up in the QP's events slot instead of leaving it in the socket");

/* Counters read in /sys/module/xiw/parameters. */
static atomic64_t xiw_fpdus_placed = ATOMIC64_INIT(0);
static atomic64_t xiw_cq_events_direct = ATOMIC64_INIT(0);
static atomic64_t xiw_fpdus_handed = ATOMIC64_INIT(0);
static atomic64_t xiw_read_fpdus_placed = ATOMIC64_INIT(0);

static int xiw_counter_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(kp->arg));
}

static const struct kernel_param_ops xiw_counter_ops = {
	.get = xiw_counter_get,
};

module_param_cb(fpdus_placed, &xiw_counter_ops, &xiw_fpdus_placed, 0444);
MODULE_PARM_DESC(fpdus_placed, "RDMA Write FPDUs placed from sockets so far");
module_param_cb(cq_events_direct, &xiw_counter_ops, &xiw_cq_events_direct,
		0444);
MODULE_PARM_DESC(cq_events_direct,
		 "completion channels woken from the socket so far");
module_param_cb(fpdus_handed, &xiw_counter_ops, &xiw_fpdus_handed, 0444);
MODULE_PARM_DESC(fpdus_handed,
		 "FPDUs handed up in events slots from sockets so far");
module_param_cb(read_fpdus_placed, &xiw_counter_ops, &xiw_read_fpdus_placed,
		0444);
MODULE_PARM_DESC(read_fpdus_placed,
		 "RDMA Read Response FPDUs placed from sockets so far");

/* Regions above this are left to the provider (4 GiB of 4 KiB pages). */
#define XIW_PIN_MAX_PAGES	BIT(20)
/* Pages pinned per call. */
#define XIW_PIN_BATCH		512ul

void xiw_pd_init(struct xiw_pd *pd)
{
	xa_init(&pd->mrs);
}

void xiw_pd_fini(struct xiw_pd *pd)
{
	/* Its regions are gone first (the core keeps the PD while they live). */
	WARN_ON(!xa_empty(&pd->mrs));
	xa_destroy(&pd->mrs);
}

/*
 * Pins the region [start, start + len) of the calling process for
 * placement, at TO `iova`, and enters it in its PD's table under its STag.
 * On failure, or with placement off, the region is simply not placed into.
 */
int xiw_mr_pin(struct xiw_mr *mr, u64 start, u64 len, u64 iova)
{
	unsigned long first = start & ~PAGE_MASK, n, done = 0;
	struct xiw_pd *pd = to_xpd(mr->base.pd);
	struct page **pages;
	int got = 0, rv;

	if (!READ_ONCE(kernel_place))
		return -EOPNOTSUPP;
	if (!len || start + len < start || iova + len < iova)
		return -EINVAL;
	n = DIV_ROUND_UP(first + len, PAGE_SIZE);
	if (n > XIW_PIN_MAX_PAGES)
		return -E2BIG;
	pages = kvcalloc(n, sizeof(*pages), GFP_KERNEL);
	if (!pages)
		return -ENOMEM;
	rv = account_locked_vm(current->mm, n, true);
	if (rv)
		goto free;
	while (done < n) {
		got = pin_user_pages_fast((start & PAGE_MASK) + done * PAGE_SIZE,
					  min(n - done, XIW_PIN_BATCH),
					  FOLL_WRITE | FOLL_LONGTERM,
					  pages + done);
		if (got <= 0)
			break;
		done += got;
	}
	if (done < n) {
		rv = got < 0 ? got : -EFAULT;
		goto unpin;
	}
	mr->pages = pages;
	mr->npages = n;
	mr->first = first;
	mr->iova = iova;
	mr->len = len;
	mr->mm = current->mm;
	mmgrab(mr->mm);
	refcount_set(&mr->users, 1);
	init_completion(&mr->idle);
	rv = xa_insert(&pd->mrs, mr->base.rkey, mr, GFP_KERNEL);
	if (rv) {
		mmdrop(mr->mm);
		mr->pages = NULL;
		goto unpin;
	}
	return 0;
unpin:
	unpin_user_pages(pages, done);
	account_locked_vm(current->mm, n, false);
free:
	kvfree(pages);
	return rv;
}

/*
 * The region is placed into no more: out of the table, a placement under
 * way over, its pages given back. Called for an invalidated STag and at
 * deregistration, in process context.
 */
void xiw_mr_unplace(struct xiw_mr *mr)
{
	struct xiw_pd *pd = to_xpd(mr->base.pd);

	if (!mr->pages ||
	    xa_cmpxchg(&pd->mrs, mr->base.rkey, mr, NULL, GFP_KERNEL) != mr)
		return;
	if (!refcount_dec_and_test(&mr->users))
		wait_for_completion(&mr->idle);
	unpin_user_pages_dirty_lock(mr->pages, mr->npages, true);
	account_locked_vm(mr->mm, mr->npages, false);
	mmdrop(mr->mm);
	kvfree(mr->pages);
	mr->pages = NULL;
}

static void xiw_mr_put(struct xiw_mr *mr)
{
	if (refcount_dec_and_test(&mr->users))
		complete(&mr->idle);
}

/*
 * The Write accounting of the receive engine (WriteTally in
 * provider/engine/src/recv/mod.rs), which Immediate Data reads: every
 * message forgets the Write before it, a Write's last segment makes one.
 */
struct xiw_tally {
	u64 write_len;
	u64 after_write;
	bool after_valid;
};

static void xiw_tally_written(struct xiw_tally *t, u32 n, bool last)
{
	t->after_valid = false;
	t->write_len += n;
	if (last) {
		t->after_write = t->write_len;
		t->after_valid = true;
		t->write_len = 0;
	}
}

/* What one pass over the socket carries. */
struct xiw_place {
	struct ib_pd *pd;
	bool crc;
	bool stop;
	struct xiw_tally tally;
	unsigned int placed;
	/* The Read lent (while `read_lent`), its segments placed, its last. */
	struct xiw_fpdu_read read;
	bool read_lent;
	bool read_done;
	unsigned int reads_placed;
	/* The FPDU it stopped at: what it completes (XIW_FPDU_EV_*), its size. */
	int event;
	u32 next_total;
};

/* Whether the CRC of the FPDU of `total` bytes at `off` of `skb` holds. */
static bool xiw_skb_crc_ok(struct sk_buff *skb, unsigned int off, u32 total)
{
	struct skb_seq_state st;
	unsigned int n, done = 0;
	const u8 *data;
	u8 trailer[4];
	u32 crc = 0;

	if (skb_copy_bits(skb, off + total - 4, trailer, 4))
		return false;
	skb_prepare_seq_read(skb, off, off + total - 4, &st);
	/* A block may run past the end asked for: the CRC stops there. */
	while (done < total - 4 && (n = skb_seq_read(done, &data, &st)) != 0) {
		n = min(n, total - 4 - done);
		crc = xiw_fpdu_crc(crc, data, n);
		done += n;
	}
	skb_abort_seq_read(&st);
	return done == total - 4 && xiw_fpdu_trailer_ok(crc, trailer);
}

/* Copies the payload of `f` at `off` of `skb` to byte `at` of `mr`. */
static bool xiw_copy(struct xiw_mr *mr, u64 at, struct sk_buff *skb,
		     unsigned int off, u32 len)
{
	u64 pos = mr->first + at;

	while (len) {
		unsigned int po = pos & ~PAGE_MASK;
		unsigned int n = min_t(u64, len, PAGE_SIZE - po);
		struct page *page = mr->pages[pos >> PAGE_SHIFT];
		void *dst = kmap_local_page(page);
		int rv = skb_copy_bits(skb, off, dst + po, n);

		kunmap_local(dst);
		if (rv)
			return false;
		flush_dcache_page(page);
		pos += n;
		off += n;
		len -= n;
	}
	return true;
}

/*
 * Places the RDMA Write or (`read`) Read Response `f` at `off` of `skb` if
 * every check passes.
 */
static bool xiw_place_fpdu(struct xiw_place *p, struct sk_buff *skb,
			   unsigned int off, const struct xiw_fpdu *f, bool read)
{
	struct xiw_fpdu_mr d;
	struct xiw_mr *mr;
	bool ok;
	u64 at;

	if (read && !p->read_lent)
		return false;
	if (p->crc && !xiw_skb_crc_ok(skb, off, f->total))
		return false;
	/* A zero-length Write touches no memory (a Read's sink is checked). */
	if (!f->data_len && !read)
		return true;
	rcu_read_lock();
	mr = xa_load(&to_xpd(p->pd)->mrs, f->stag);
	if (mr && !refcount_inc_not_zero(&mr->users))
		mr = NULL;
	rcu_read_unlock();
	if (!mr)
		return false;
	d.stag = mr->base.rkey;
	d.pd = mr->base.pd;
	d.iova = mr->iova;
	d.len = mr->len;
	d.access = mr->access;
	d.valid = true;
	/* The provider lends the stream only while the QP takes remote Writes. */
	ok = !(read ? xiw_fpdu_check_read(f, &p->read, &d, p->pd, &at) :
		      xiw_fpdu_check(f, &d, p->pd, XIW_FPDU_REMOTE_WRITE, &at)) &&
	     xiw_copy(mr, at, skb, off + XIW_FPDU_HEAD, f->data_len);
	xiw_mr_put(mr);
	return ok;
}

static int xiw_place_actor(read_descriptor_t *desc, struct sk_buff *skb,
			   unsigned int off, size_t len)
{
	struct xiw_place *p = desc->arg.data;
	u8 hdr[XIW_FPDU_HEAD];
	struct xiw_fpdu f = {};
	size_t used = 0;
	u32 have;
	int kind;

	while (!p->stop && used < len) {
		have = min_t(size_t, len - used, XIW_FPDU_HEAD);
		if (skb_copy_bits(skb, off + used, hdr, have)) {
			p->stop = true;
			break;
		}
		kind = xiw_fpdu_head(hdr, have, &f);
		if ((kind != XIW_FPDU_PLACE && kind != XIW_FPDU_READ) ||
		    f.total > len - used ||
		    !xiw_place_fpdu(p, skb, off + used, &f,
				    kind == XIW_FPDU_READ)) {
			p->stop = true;
			p->event = xiw_fpdu_event(hdr, have);
			p->next_total = f.total;
			break;
		}
		if (kind == XIW_FPDU_PLACE) {
			xiw_tally_written(&p->tally, f.data_len, f.last);
			p->placed++;
		} else {
			/* Every message forgets the Write before it. */
			p->tally.after_valid = false;
			p->reads_placed++;
			if (xiw_fpdu_read_placed(&p->read, &f)) {
				p->read_lent = false;
				p->read_done = true;
			}
		}
		used += f.total;
	}
	if (p->stop)
		desc->count = 0;
	return used;
}

/*
 * The FPDU at the head of the stream, which the module did not place,
 * completes a receive (`event`) and is whole in the socket (`whole`): wake
 * the completion channel of the QP's receive CQ if it is armed for it.
 */
static bool xiw_place_signal(struct xiw_stream_ev *ev,
			     const struct xiw_place *p, bool whole)
{
	if (!READ_ONCE(direct_cq_event) || p->event == XIW_FPDU_EV_NONE ||
	    !ev->rcq || !whole ||
	    !xiw_cq_event(ev->rcq, p->event == XIW_FPDU_EV_SOLICITED, ev))
		return false;
	atomic64_inc(&xiw_cq_events_direct);
	return true;
}

struct xiw_hand {
	u8 *to;
	u32 want;
	u32 got;
};

static int xiw_hand_actor(read_descriptor_t *desc, struct sk_buff *skb,
			  unsigned int off, size_t len)
{
	struct xiw_hand *h = desc->arg.data;
	u32 n = min_t(size_t, len, h->want - h->got);

	if (!n || skb_copy_bits(skb, off, h->to + h->got, n)) {
		desc->count = 0;
		return 0;
	}
	h->got += n;
	if (h->got == h->want)
		desc->count = 0;
	return n;
}

/*
 * The FPDU of `total` bytes at the head of the stream, which the module did
 * not place, is whole in the socket: if it fits the slot, and the provider
 * has not taken the stream back meanwhile, the stream is handed back
 * (XIW_PLACE_HANDED) and the FPDU's bytes leave the socket for the slot's
 * `hand`, the stream's next bytes for the provider; `hand_len`, released
 * last with XIW_HAND_DONE, says they are there.
 */
static bool xiw_place_hand(struct sock *sk, struct xiw_events_slot *s,
			   u32 total)
{
	struct xiw_hand h = { .to = s->hand, .want = total };
	read_descriptor_t desc = { .arg.data = &h, .count = 1 };

	if (!READ_ONCE(hand_up) || !total || total > XIW_HAND_BYTES)
		return false;
	/*
	 * Cleared before the claim, so that the provider, which reads it only
	 * once it finds the claim, never sees an earlier XIW_HAND_DONE (the
	 * mark of more bytes keeps the bits it finds).
	 */
	WRITE_ONCE(s->hand_len, 0);
	if (cmpxchg(&s->place, XIW_PLACE_KERNEL, XIW_PLACE_HANDED) !=
	    XIW_PLACE_KERNEL)
		return false;
	tcp_read_sock(sk, &desc, xiw_hand_actor);
	/* The bytes before the word that says they are there. */
	smp_store_release(&s->hand_len, h.got | XIW_HAND_DONE |
			  (tcp_inq(sk) ? XIW_HAND_MORE : 0));
	if (h.got)
		atomic64_inc(&xiw_fpdus_handed);
	return true;
}

/*
 * Sets and clears bits of the slot's flags in place: the provider may or in
 * XIW_PLACE_F_READ meanwhile (lending a Read it just sent).
 */
static void xiw_slot_flags(struct xiw_events_slot *s, u32 set, u32 clear)
{
	u32 old = READ_ONCE(s->flags), new;

	do {
		new = (old & ~clear) | set;
	} while (!try_cmpxchg(&s->flags, &old, new));
}

/*
 * The socket's receive callback, for a stream of the context's: places what
 * it can if the provider lent the stream (XIW_PLACE_ALL if that was all).
 * What is left goes back to the provider, and if it is a message that
 * completes a receive, its completion channel may be woken already
 * (XIW_PLACE_LEFT_SIGNALLED).
 */
int xiw_place_stream(struct sock *sk, struct xiw_stream_ev *ev)
{
	struct xiw_place p = { .pd = ev->pd, .crc = ev->crc };
	struct xiw_events_slot *s;
	read_descriptor_t desc = {};
	u32 place, len, flags;
	bool whole;

	if (!ev->uctx)
		return XIW_PLACE_LEFT;
	s = xiw_stream_slot(ev);
	/* The tally after the stream (the provider: the reverse). */
	place = smp_load_acquire(&s->place);
	if (place == XIW_PLACE_HANDED) {
		len = READ_ONCE(s->hand_len);
		if (!(len & XIW_HAND_MORE))
			/* Bytes after those handed up: the provider reads the socket. */
			smp_store_release(&s->hand_len, len | XIW_HAND_MORE);
	}
	if (!READ_ONCE(kernel_place) || !ev->pd || place != XIW_PLACE_KERNEL)
		return XIW_PLACE_LEFT;
	/* The Read after its flag (the provider may lend it while lent). */
	flags = smp_load_acquire(&s->flags);
	p.tally.write_len = READ_ONCE(s->write_len);
	p.tally.after_write = READ_ONCE(s->after_write);
	p.tally.after_valid = flags & XIW_PLACE_F_AFTER_WRITE;
	p.read_lent = flags & XIW_PLACE_F_READ;
	if (p.read_lent) {
		p.read.stag = READ_ONCE(s->read_stag);
		p.read.to = READ_ONCE(s->read_to);
		p.read.left = READ_ONCE(s->read_left);
	}
	desc.arg.data = &p;
	desc.count = 1;
	tcp_read_sock(sk, &desc, xiw_place_actor);
	/* Nothing placed leaves the slot as the provider lent it. */
	if (p.placed || p.reads_placed) {
		WRITE_ONCE(s->write_len, p.tally.write_len);
		WRITE_ONCE(s->after_write, p.tally.after_write);
		if (p.reads_placed) {
			WRITE_ONCE(s->read_to, p.read.to);
			WRITE_ONCE(s->read_left, p.read.left);
		}
		xiw_slot_flags(s, p.tally.after_valid ? XIW_PLACE_F_AFTER_WRITE : 0,
			       (p.tally.after_valid ? 0 : XIW_PLACE_F_AFTER_WRITE) |
			       (p.read_done ? XIW_PLACE_F_READ : 0));
		atomic64_add(p.placed, &xiw_fpdus_placed);
		atomic64_add(p.reads_placed, &xiw_read_fpdus_placed);
	}
	/* A Read answered: the provider completes it. */
	if (!p.stop)
		return p.read_done ? XIW_PLACE_LEFT : XIW_PLACE_ALL;
	whole = p.next_total && (u32)tcp_inq(sk) >= p.next_total;
	if (!whole || !xiw_place_hand(sk, s, p.next_total))
		/* The tally before the stream goes back (the provider: the reverse). */
		smp_store_release(&s->place, XIW_PLACE_USER);
	return xiw_place_signal(ev, &p, whole) ? XIW_PLACE_LEFT_SIGNALLED :
						XIW_PLACE_LEFT;
}

/* The provider invalidated the region's STag: nothing more goes into it. */
static int UVERBS_HANDLER(XIW_METHOD_MR_INVALIDATE)(struct uverbs_attr_bundle *attrs)
{
	struct ib_mr *mr = uverbs_attr_get_obj(attrs,
					       XIW_ATTR_MR_INVALIDATE_HANDLE);

	if (IS_ERR(mr))
		return PTR_ERR(mr);
	xiw_mr_unplace(to_xmr(mr));
	return 0;
}

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_MR_INVALIDATE,
			    UVERBS_ATTR_IDR(XIW_ATTR_MR_INVALIDATE_HANDLE,
					    UVERBS_OBJECT_MR,
					    UVERBS_ACCESS_READ,
					    UA_MANDATORY));

ADD_UVERBS_METHODS(xiw_mr_methods, UVERBS_OBJECT_MR,
		   &UVERBS_METHOD(XIW_METHOD_MR_INVALIDATE));

const struct uapi_definition xiw_place_uapi_defs[] = {
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_MR, &xiw_mr_methods),
	{},
};
