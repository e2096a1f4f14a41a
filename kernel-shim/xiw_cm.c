// SPDX-License-Identifier: GPL-2.0
/*
 * xiw: the iWARP connection manager's side of the module. For rdma_cm it
 * makes the TCP connections (listening, accepting, connecting), does the MPA
 * exchange (RFC 5044, with RFC 6581's IRD/ORD and ready-to-receive message
 * when the peer speaks it), and hands the connected socket to the process
 * that owns the QP: the provider takes it with XIW_METHOD_TAKE_STREAM, and
 * only then is the connection reported established. Afterwards the module
 * only watches the socket's state, to report the disconnect and the close.
 *
 * A connection endpoint (struct xiw_cep) is driven by one work item on an
 * ordered workqueue; the socket's callbacks only queue it.
 */

#include <linux/eventfd.h>
#include <linux/file.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/net.h>
#include <linux/workqueue.h>
#include <net/ipv6.h>
#include <net/sock.h>
#include <net/tcp.h>
#include <net/tcp_states.h>
#include <rdma/iw_cm.h>
#include <rdma/uverbs_ioctl.h>

#define UVERBS_MODULE_NAME xiw_ib_cm
#include <rdma/uverbs_named_ioctl.h>

#include "xiw.h"

static bool mpa_crc;
module_param(mpa_crc, bool, 0644);
MODULE_PARM_DESC(mpa_crc, "ask peers for MPA CRC (either side asking means CRC)");

#define MPA_HDR_LEN 20
#define MPA_MAX_PD 512
#define MPA_ENHANCED_LEN 4
#define MPA_FLAG_MARKERS 0x80
#define MPA_FLAG_CRC 0x40
#define MPA_FLAG_REJECT 0x20
#define MPA_FLAG_ENHANCED 0x10
#define MPA_IRD_ORD_MASK 0x3fff
#define MPA_P2P 0x8000		/* in IRD: peer-to-peer */
#define MPA_RTR_SEND 0x4000	/* in IRD */
#define MPA_RTR_WRITE 0x8000	/* in ORD */
#define MPA_RTR_READ 0x4000	/* in ORD */

/* How long a peer may take to send its MPA frame, or to take a connection. */
#define XIW_MPA_TIMEOUT (10 * HZ)

static const char mpa_req_key[16] = "MPA ID Req Frame";
static const char mpa_rep_key[16] = "MPA ID Rep Frame";

enum xiw_cep_state {
	XIW_CEP_LISTEN,
	XIW_CEP_CONNECTING,	/* active: the TCP connection is being made */
	XIW_CEP_AWAIT_REQ,	/* passive: reading the Request */
	XIW_CEP_AWAIT_ACCEPT,	/* passive: reported, the application decides */
	XIW_CEP_AWAIT_REPLY,	/* active: reading the Reply */
	XIW_CEP_AWAIT_TAKE,	/* MPA done, the provider takes the socket */
	XIW_CEP_TAKEN,		/* the provider has it, not yet reported */
	XIW_CEP_CONNECTED,	/* reported established */
	XIW_CEP_CLOSED,
};

struct xiw_cep {
	struct kref ref;
	struct mutex lock;	/* state, everything below; work and verbs */
	enum xiw_cep_state state;
	struct xiw_device *xdev;
	struct iw_cm_id *cm_id;	/* with a reference */
	struct xiw_cep *listener;	/* passive, until reported */
	struct socket *sock;	/* owned until the handover */
	struct file *file;	/* the socket's file, after the handover */
	struct xiw_qp *qp;
	struct xiw_ucontext *uctx;	/* the QP's owner, for the handover */
	struct list_head entry;	/* in uctx->ready or ->taken, or the listener's list */
	struct list_head children;	/* a listener's connections not reported */
	struct delayed_work work;
	unsigned long deadline;
	bool active;
	bool alive;		/* the reference from xiw_cep_alloc is held */
	bool disconnect_reported;
	u8 frame[MPA_HDR_LEN + MPA_MAX_PD];
	unsigned int got;
	/* Active: the application's private data, until the Request is sent. */
	void *pdata;
	u16 pdata_len;
	u16 ird, ord, peer_ird, peer_ord;
	u8 rtr;
	bool crc;
	void (*orig_data_ready)(struct sock *sk);
	void (*orig_state_change)(struct sock *sk);
	void (*orig_write_space)(struct sock *sk);
	/* After the handover: where the stream's events are marked. */
	struct xiw_stream_ev ev;
};

static struct workqueue_struct *xiw_cm_wq;

static void xiw_cep_work(struct work_struct *w);

static void xiw_cep_free(struct kref *ref)
{
	struct xiw_cep *cep = container_of(ref, struct xiw_cep, ref);

	kfree(cep->pdata);
	kfree(cep);
}

static void xiw_cep_put(struct xiw_cep *cep)
{
	kref_put(&cep->ref, xiw_cep_free);
}

static void xiw_cep_put_n(struct xiw_cep *cep, int n)
{
	while (n-- > 0)
		xiw_cep_put(cep);
}

/* Runs the endpoint's work after `delay`, holding a reference for it. */
/* Runs the endpoint's work now (sooner than a look already planned). */
static void xiw_cep_kick(struct xiw_cep *cep)
{
	kref_get(&cep->ref);
	if (mod_delayed_work(xiw_cm_wq, &cep->work, 0))
		xiw_cep_put(cep);
}

/*
 * Runs the endpoint's work after `delay`, unless a run is already planned:
 * a kick that came while the work ran stays a kick.
 */
static void xiw_cep_look_at(struct xiw_cep *cep, unsigned long delay)
{
	kref_get(&cep->ref);
	if (!queue_delayed_work(xiw_cm_wq, &cep->work, delay))
		xiw_cep_put(cep);
}

static struct xiw_cep *xiw_cep_of(struct sock *sk)
{
	return sk->sk_user_data;
}

static void xiw_sk_data_ready(struct sock *sk)
{
	struct xiw_cep *cep;

	read_lock_bh(&sk->sk_callback_lock);
	cep = xiw_cep_of(sk);
	if (cep)
		xiw_cep_kick(cep);
	read_unlock_bh(&sk->sk_callback_lock);
}

static void xiw_sk_state_change(struct sock *sk)
{
	void (*orig)(struct sock *sk) = NULL;
	struct xiw_cep *cep;

	read_lock_bh(&sk->sk_callback_lock);
	cep = xiw_cep_of(sk);
	if (cep) {
		orig = cep->orig_state_change;
		xiw_cep_kick(cep);
		xiw_stream_mark(&cep->ev, XIW_EV_DATA | XIW_EV_WRITABLE |
				XIW_EV_CLOSED);
	}
	read_unlock_bh(&sk->sk_callback_lock);
	if (orig)
		orig(sk);
}

/* After the handover: the provider's stream has bytes to read. */
static void xiw_sk_stream_data_ready(struct sock *sk)
{
	void (*orig)(struct sock *sk) = NULL;
	struct xiw_cep *cep;

	read_lock_bh(&sk->sk_callback_lock);
	cep = xiw_cep_of(sk);
	/* What the module placed needs nobody woken. */
	switch (cep ? xiw_place_stream(sk, &cep->ev) : XIW_PLACE_ALL) {
	case XIW_PLACE_ALL:
		break;
	case XIW_PLACE_LEFT_SIGNALLED:
		/*
		 * Marked for the woken application to read (or the progress
		 * thread later) as its channel was woken.
		 */
		orig = cep->orig_data_ready;
		break;
	default:
		orig = cep->orig_data_ready;
		xiw_stream_mark(&cep->ev, XIW_EV_DATA);
	}
	read_unlock_bh(&sk->sk_callback_lock);
	if (orig)
		orig(sk);
}

/* After the handover: the provider's stream has room to send again. */
static void xiw_sk_stream_write_space(struct sock *sk)
{
	void (*orig)(struct sock *sk) = NULL;
	struct xiw_cep *cep;

	read_lock_bh(&sk->sk_callback_lock);
	cep = xiw_cep_of(sk);
	if (cep) {
		orig = cep->orig_write_space;
		xiw_stream_mark(&cep->ev, XIW_EV_WRITABLE);
	}
	read_unlock_bh(&sk->sk_callback_lock);
	if (orig)
		orig(sk);
}

/*
 * The stream goes to the provider: its events are marked in the slot of
 * the QP's context from now on. The socket is watched already (its state).
 */
static void xiw_cep_stream(struct xiw_cep *cep, struct xiw_ucontext *uctx,
			   int slot)
{
	struct sock *sk = cep->sock->sk;

	if (slot < 0 || !uctx->events)
		return;
	write_lock_bh(&sk->sk_callback_lock);
	if (sk->sk_user_data == cep) {
		cep->ev.slot = slot;
		cep->ev.pd = cep->qp->base.pd;
		cep->ev.rcq = cep->qp->base.recv_cq;
		cep->ev.crc = cep->crc;
		WRITE_ONCE(cep->ev.uctx, uctx);
		/* A new stream is the provider's until it lends it. */
		xiw_stream_place_reset(&cep->ev);
		cep->orig_write_space = sk->sk_write_space;
		sk->sk_data_ready = xiw_sk_stream_data_ready;
		sk->sk_write_space = xiw_sk_stream_write_space;
		/* What came before is for the provider to read, too. */
		xiw_stream_mark(&cep->ev, XIW_EV_DATA | XIW_EV_WRITABLE);
	}
	write_unlock_bh(&sk->sk_callback_lock);
}

/*
 * Watches the socket: its data (`data` set) and its state. False if the
 * socket is someone else's to watch.
 */
static bool xiw_cep_watch(struct xiw_cep *cep, bool data)
{
	struct sock *sk = cep->sock->sk;
	bool ours;

	write_lock_bh(&sk->sk_callback_lock);
	if (!sk->sk_user_data) {
		kref_get(&cep->ref);
		sk->sk_user_data = cep;
		cep->orig_data_ready = sk->sk_data_ready;
		cep->orig_state_change = sk->sk_state_change;
		sk->sk_state_change = xiw_sk_state_change;
	}
	ours = sk->sk_user_data == cep;
	if (ours)
		sk->sk_data_ready = data ? xiw_sk_data_ready :
				    cep->orig_data_ready;
	write_unlock_bh(&sk->sk_callback_lock);
	return ours;
}

/* Gives the socket its own callbacks back. */
static void xiw_cep_unwatch(struct xiw_cep *cep)
{
	struct sock *sk = cep->sock ? cep->sock->sk : NULL;
	bool had = false;

	if (!sk) {
		xiw_stream_ev_stop(&cep->ev);
		return;
	}
	write_lock_bh(&sk->sk_callback_lock);
	if (sk->sk_user_data == cep) {
		sk->sk_data_ready = cep->orig_data_ready;
		sk->sk_state_change = cep->orig_state_change;
		if (cep->orig_write_space)
			sk->sk_write_space = cep->orig_write_space;
		sk->sk_user_data = NULL;
		had = true;
	}
	write_unlock_bh(&sk->sk_callback_lock);
	xiw_stream_ev_stop(&cep->ev);
	if (had)
		xiw_cep_put(cep);
}

static struct xiw_cep *xiw_cep_alloc(struct xiw_device *xdev)
{
	struct xiw_cep *cep = kzalloc(sizeof(*cep), GFP_KERNEL);

	if (!cep)
		return NULL;
	kref_init(&cep->ref);
	mutex_init(&cep->lock);
	INIT_DELAYED_WORK(&cep->work, xiw_cep_work);
	cep->alive = true;
	cep->xdev = xdev;
	INIT_LIST_HEAD(&cep->entry);
	INIT_LIST_HEAD(&cep->children);
	xiw_stream_ev_init(&cep->ev);
	return cep;
}

/* Whether the peer's frame (its header in) carries RFC 6581's IRD/ORD block. */
static bool xiw_mpa_enhanced(const struct xiw_cep *cep)
{
	return cep->frame[17] >= 2 && (cep->frame[16] & MPA_FLAG_ENHANCED) &&
	       get_unaligned_be16(&cep->frame[18]) >= MPA_ENHANCED_LEN;
}

/* Where the application's private data of the peer's frame starts; its length. */
static unsigned int xiw_mpa_pdata(const struct xiw_cep *cep, unsigned int *len)
{
	unsigned int off = xiw_mpa_enhanced(cep) ? MPA_ENHANCED_LEN : 0;

	*len = get_unaligned_be16(&cep->frame[18]) - off;
	return MPA_HDR_LEN + off;
}

/*
 * A new endpoint for the connected, accepted or listening socket `s`, which
 * it owns from now on; NULL (the socket released) without memory.
 */
static struct xiw_cep *xiw_cep_of_sock(struct xiw_device *xdev,
				       struct socket *s)
{
	struct xiw_cep *cep = xiw_cep_alloc(xdev);

	if (!cep) {
		sock_release(s);
		return NULL;
	}
	cep->sock = s;
	return cep;
}

/* Reports `type` to the connection manager on the endpoint's cm_id. */
static void xiw_cm_report(struct xiw_cep *cep, struct iw_cm_id *id,
			  enum iw_cm_event_type type, int status, bool pdata)
{
	struct iw_cm_event ev = {};
	unsigned int len;

	if (!id)
		return;
	ev.event = type;
	ev.status = status;
	ev.provider_data = cep;
	/* The socket's addresses; a connect that failed has no peer's. */
	ev.local_addr = id->local_addr;
	ev.remote_addr = id->remote_addr;
	if (cep->sock) {
		kernel_getsockname(cep->sock, (struct sockaddr *)&ev.local_addr);
		kernel_getpeername(cep->sock, (struct sockaddr *)&ev.remote_addr);
	}
	if (pdata && cep->got >= MPA_HDR_LEN) {
		/* xiw_mpa_recv took only frames whose data fits the event. */
		ev.private_data = &cep->frame[xiw_mpa_pdata(cep, &len)];
		ev.private_data_len = len;
		ev.ird = cep->peer_ird;
		ev.ord = cep->peer_ord;
	}
	id->event_handler(id, &ev);
}

/*
 * Sends an MPA frame: key, flags, pdata, and the RFC 6581 IRD/ORD block. A
 * Request is revision 2 with the block; a Reply answers in the Request's
 * revision, with the block only if the Request had one.
 */
static int xiw_mpa_send(struct xiw_cep *cep, const char *key, u8 flags,
			u16 ird, u16 ord, const void *pdata, unsigned int len)
{
	u8 hdr[MPA_HDR_LEN + MPA_ENHANCED_LEN];
	bool reply = key == mpa_rep_key;
	bool enhanced = !reply || xiw_mpa_enhanced(cep);
	unsigned int hlen = enhanced ? sizeof(hdr) : MPA_HDR_LEN;
	struct msghdr msg = { .msg_flags = MSG_NOSIGNAL };
	struct kvec iov[2] = {
		{ .iov_base = hdr, .iov_len = hlen },
		{ .iov_base = (void *)pdata, .iov_len = len },
	};
	int rv;

	if (len > MPA_MAX_PD - MPA_ENHANCED_LEN)
		return -EINVAL;
	memcpy(hdr, key, 16);
	hdr[16] = flags | (enhanced ? MPA_FLAG_ENHANCED : 0);
	hdr[17] = reply ? cep->frame[17] : 2;
	put_unaligned_be16(len + hlen - MPA_HDR_LEN, &hdr[18]);
	put_unaligned_be16(ird, &hdr[20]);
	put_unaligned_be16(ord, &hdr[22]);
	rv = kernel_sendmsg(cep->sock, &msg, iov, len ? 2 : 1, hlen + len);
	if (rv < 0)
		return rv;
	return rv == hlen + len ? 0 : -EIO;
}

/*
 * Reads the peer's MPA frame, never past it (what follows is the
 * provider's). 1 once complete, 0 for more to come, or an error.
 */
static int xiw_mpa_recv(struct xiw_cep *cep, const char *key)
{
	struct msghdr msg = { .msg_flags = MSG_DONTWAIT };
	unsigned int want = MPA_HDR_LEN;
	unsigned int len;
	struct kvec iov;
	int rv;

	for (;;) {
		if (cep->got >= MPA_HDR_LEN) {
			if (memcmp(cep->frame, key, 16) || cep->frame[17] < 1 ||
			    cep->frame[17] > 2)
				return -EPROTO;
			want = MPA_HDR_LEN + get_unaligned_be16(&cep->frame[18]);
			if (want > sizeof(cep->frame))
				return -EPROTO;
			/* The connection manager carries at most 255 bytes of it. */
			xiw_mpa_pdata(cep, &len);
			if (len > U8_MAX)
				return -EMSGSIZE;
		}
		if (cep->got == want)
			return 1;
		iov.iov_base = cep->frame + cep->got;
		iov.iov_len = want - cep->got;
		rv = kernel_recvmsg(cep->sock, &msg, &iov, 1, iov.iov_len,
				    MSG_DONTWAIT);
		if (rv == -EAGAIN)
			return 0;
		if (rv < 0)
			return rv;
		if (rv == 0)
			return -ECONNRESET;
		cep->got += rv;
	}
}

/* The peer's IRD/ORD block, if it sent one; the RTR kinds it flags. */
static u32 xiw_mpa_peer(struct xiw_cep *cep, u16 *ird, u16 *ord)
{
	u16 i, o;

	if (!xiw_mpa_enhanced(cep)) {
		*ird = 1;
		*ord = 1;
		return 0;
	}
	i = get_unaligned_be16(&cep->frame[20]);
	o = get_unaligned_be16(&cep->frame[22]);
	*ird = i & MPA_IRD_ORD_MASK;
	*ord = o & MPA_IRD_ORD_MASK;
	return (u32)(i & ~MPA_IRD_ORD_MASK) << 16 | (o & ~MPA_IRD_ORD_MASK);
}

/*
 * Ends an endpoint: gives its socket its callbacks back and releases it (or
 * the module's reference to its file, after the handover), unties it from
 * its QP and its cm_id. The caller holds cep->lock and a reference of its
 * own; it drops the references this returns the count of (the endpoint's
 * own, and the cm_id's) after unlocking.
 */
static int xiw_cep_end(struct xiw_cep *cep)
{
	struct iw_cm_id *id = cep->cm_id;
	struct xiw_qp *qp = cep->qp;
	int n = 0;

	cep->state = XIW_CEP_CLOSED;
	xiw_cep_unwatch(cep);
	if (cep->file) {
		fput(cep->file);
		cep->file = NULL;
		cep->sock = NULL;
	} else if (cep->sock) {
		sock_release(cep->sock);
		cep->sock = NULL;
	}
	if (qp) {
		spin_lock(&qp->cep_lock);
		if (qp->cep == cep)
			qp->cep = NULL;
		spin_unlock(&qp->cep_lock);
		cep->qp = NULL;
	}
	if (id) {
		cep->cm_id = NULL;
		if (id->provider_data == cep) {
			id->provider_data = NULL;
			n++;
		}
		id->rem_ref(id);
	}
	if (cep->alive) {
		cep->alive = false;
		n++;
	}
	return n;
}

/*
 * Takes the endpoint out of its context's lists (to take, taken); 1 if it
 * was in one (the list's reference, for the caller to drop).
 */
static int xiw_cep_unready(struct xiw_cep *cep)
{
	struct xiw_ucontext *uctx = cep->uctx;
	int was = 0;

	if (!uctx)
		return 0;
	spin_lock(&uctx->lock);
	if (!list_empty(&cep->entry)) {
		list_del_init(&cep->entry);
		was = 1;
	}
	spin_unlock(&uctx->lock);
	return was;
}

/*
 * The connection failed before it was reported established. The active
 * side hears so in its reply; an accepted one (whose QP the connection
 * manager holds until the connection closes) is reported established and
 * closed at once. As xiw_cep_end, whose count it returns.
 */
static int xiw_cep_fail(struct xiw_cep *cep, int err)
{
	int n = xiw_cep_unready(cep);
	bool bound = cep->state == XIW_CEP_AWAIT_TAKE ||
		     cep->state == XIW_CEP_TAKEN;

	if (cep->active && (bound || cep->state == XIW_CEP_CONNECTING ||
			    cep->state == XIW_CEP_AWAIT_REPLY)) {
		xiw_cm_report(cep, cep->cm_id, IW_CM_EVENT_CONNECT_REPLY,
			      err, false);
	} else if (!cep->active && bound) {
		xiw_cm_report(cep, cep->cm_id, IW_CM_EVENT_ESTABLISHED, 0, false);
		xiw_cm_report(cep, cep->cm_id, IW_CM_EVENT_CLOSE, err, false);
	}
	return n + xiw_cep_end(cep);
}

/* Queues the connection for its owner's provider and wakes it. */
static void xiw_cep_ready(struct xiw_cep *cep)
{
	struct xiw_ucontext *uctx = cep->uctx;

	cep->state = XIW_CEP_AWAIT_TAKE;
	kref_get(&cep->ref);
	spin_lock(&uctx->lock);
	list_add_tail(&cep->entry, &uctx->ready);
	spin_unlock(&uctx->lock);
	xiw_events_note_cm(uctx);
	if (uctx->cm_ev)
		xiw_eventfd_signal(uctx->cm_ev);
}

/*
 * The ready-to-receive message (RFC 6581): a zero-length RDMA Write if
 * offered, else a zero-length RDMA Read (answered by the provider as any
 * other), else a zero-length Send (taken by the provider's stream, never
 * by a receive of the application).
 */
static int xiw_mpa_rtr(u32 offered)
{
	if (!(offered & (u32)MPA_P2P << 16))
		return XIW_RTR_NONE;
	if (offered & MPA_RTR_WRITE)
		return XIW_RTR_WRITE;
	if (offered & MPA_RTR_READ)
		return XIW_RTR_READ;
	if (offered & (u32)MPA_RTR_SEND << 16)
		return XIW_RTR_SEND;
	return -EOPNOTSUPP;
}

/*
 * Ties the endpoint to QP `qp` (the caller's own); -EBUSY if another
 * endpoint has it. xiw_cep_end unties them.
 */
static int xiw_cep_claim(struct xiw_cep *cep, struct xiw_qp *qp)
{
	int rv = 0;

	spin_lock(&qp->cep_lock);
	if (qp->cep) {
		rv = -EBUSY;
	} else {
		qp->cep = cep;
		cep->qp = qp;
		cep->uctx = qp->uctx;
	}
	spin_unlock(&qp->cep_lock);
	return rv;
}

/* Ties the endpoint to its cm_id: a reference each way. */
static void xiw_cep_bind(struct xiw_cep *cep, struct iw_cm_id *id)
{
	id->add_ref(id);
	cep->cm_id = id;
	if (!id->provider_data) {
		kref_get(&cep->ref);
		id->provider_data = cep;
	}
}

/* The listener accepts what came; each connection then sends its Request. */
static void xiw_cep_accept_all(struct xiw_cep *listener)
{
	struct xiw_cep *cep;
	struct socket *s;

	while (!kernel_accept(listener->sock, &s, O_NONBLOCK)) {
		/* A child starts as a copy of the listener: its callbacks too. */
		write_lock_bh(&s->sk->sk_callback_lock);
		s->sk->sk_user_data = NULL;
		s->sk->sk_data_ready = listener->orig_data_ready;
		s->sk->sk_state_change = listener->orig_state_change;
		write_unlock_bh(&s->sk->sk_callback_lock);
		cep = xiw_cep_of_sock(listener->xdev, s);
		if (!cep)
			continue;
		cep->state = XIW_CEP_AWAIT_REQ;
		cep->deadline = jiffies + XIW_MPA_TIMEOUT;
		kref_get(&listener->ref);
		cep->listener = listener;
		list_add_tail(&cep->entry, &listener->children);
		tcp_sock_set_nodelay(s->sk);
		xiw_cep_watch(cep, true);
		xiw_cep_kick(cep);
	}
}

/* A passive connection leaves its listener's list (listener->lock held). */
static void xiw_cep_orphan(struct xiw_cep *cep)
{
	list_del_init(&cep->entry);
	cep->listener = NULL;
}

/*
 * Passive: the Request is in. Reported on the listener's cm_id, whose
 * connection manager makes a cm_id for it (provider_data, a reference) and
 * accepts or rejects. As xiw_cep_end, whose count it returns.
 */
static int xiw_cep_requested(struct xiw_cep *cep)
{
	struct xiw_cep *listener = cep->listener;
	u32 offered = xiw_mpa_peer(cep, &cep->peer_ird, &cep->peer_ord);
	int rtr = xiw_mpa_rtr(offered);
	bool reported = false;
	int n = 0;

	if ((cep->frame[16] & MPA_FLAG_MARKERS) || rtr < 0) {
		/* Markers and other RTR kinds are refused with the MPA reject. */
		xiw_mpa_send(cep, mpa_rep_key, MPA_FLAG_REJECT, 0, 0, NULL, 0);
		rtr = -1;
	}
	cep->rtr = rtr < 0 ? 0 : rtr;
	cep->crc = mpa_crc || (cep->frame[16] & MPA_FLAG_CRC);
	xiw_cep_watch(cep, false);
	mutex_lock(&listener->lock);
	xiw_cep_orphan(cep);
	if (rtr >= 0 && listener->state == XIW_CEP_LISTEN && listener->cm_id) {
		cep->state = XIW_CEP_AWAIT_ACCEPT;
		/* For the cm_id the connection manager makes (provider_data). */
		kref_get(&cep->ref);
		xiw_cm_report(cep, listener->cm_id, IW_CM_EVENT_CONNECT_REQUEST,
			      0, true);
		reported = true;
	}
	mutex_unlock(&listener->lock);
	xiw_cep_put(listener);
	if (!reported)
		n = xiw_cep_end(cep);
	return n;
}

/* Active: the Reply is in. As xiw_cep_end, whose count it returns. */
static int xiw_cep_replied(struct xiw_cep *cep)
{
	u32 offered = xiw_mpa_peer(cep, &cep->peer_ird, &cep->peer_ord);

	if (cep->frame[16] & MPA_FLAG_REJECT)
		return xiw_cep_fail(cep, -ECONNREFUSED);
	if ((cep->frame[16] & MPA_FLAG_MARKERS) ||
	    (mpa_crc && !(cep->frame[16] & MPA_FLAG_CRC)) ||
	    (offered && xiw_mpa_rtr(offered) != XIW_RTR_WRITE))
		/* A downgrading or unusable Reply. */
		return xiw_cep_fail(cep, -ECONNREFUSED);
	cep->crc = mpa_crc || (cep->frame[16] & MPA_FLAG_CRC);
	cep->rtr = offered ? XIW_RTR_WRITE : XIW_RTR_NONE;
	cep->ord = min(cep->ord, cep->peer_ird);
	xiw_cep_watch(cep, false);
	xiw_cep_ready(cep);
	return 0;
}

/* Reads an MPA frame in; on to what it means. */
static int xiw_cep_read_frame(struct xiw_cep *cep)
{
	bool req = cep->state == XIW_CEP_AWAIT_REQ;
	struct xiw_cep *listener;
	int rv;

	rv = xiw_mpa_recv(cep, req ? mpa_req_key : mpa_rep_key);
	if (rv == 0 && time_after_eq(jiffies, cep->deadline))
		rv = -ETIMEDOUT;
	if (rv == 0) {
		/* Nothing yet: look again at the deadline. */
		xiw_cep_look_at(cep, cep->deadline - jiffies);
		return 0;
	}
	if (rv > 0)
		return req ? xiw_cep_requested(cep) : xiw_cep_replied(cep);
	if (!req)
		return xiw_cep_fail(cep, rv);
	listener = cep->listener;
	if (listener) {
		mutex_lock(&listener->lock);
		xiw_cep_orphan(cep);
		mutex_unlock(&listener->lock);
		xiw_cep_put(listener);
	}
	return xiw_cep_end(cep);
}

/*
 * Active: the TCP connection is up (the Request goes, and the Reply is
 * read), failed, or not up by the deadline. As xiw_cep_end, whose count it
 * returns.
 */
static int xiw_cep_tcp_up(struct xiw_cep *cep)
{
	struct sock *sk = cep->sock->sk;
	int rv;

	if ((1 << sk->sk_state) & (TCPF_SYN_SENT | TCPF_SYN_RECV)) {
		if (time_after_eq(jiffies, cep->deadline))
			return xiw_cep_fail(cep, -ETIMEDOUT);
		xiw_cep_look_at(cep, cep->deadline - jiffies);
		return 0;
	}
	if (sk->sk_state != TCP_ESTABLISHED) {
		rv = sock_error(sk);
		return xiw_cep_fail(cep, rv ? rv : -ECONNRESET);
	}
	cep->state = XIW_CEP_AWAIT_REPLY;
	cep->deadline = jiffies + XIW_MPA_TIMEOUT;
	xiw_cep_watch(cep, true);
	rv = xiw_mpa_send(cep, mpa_req_key, mpa_crc ? MPA_FLAG_CRC : 0,
			  cep->ird | MPA_P2P, cep->ord | MPA_RTR_WRITE,
			  cep->pdata, cep->pdata_len);
	kfree(cep->pdata);
	cep->pdata = NULL;
	if (rv)
		return xiw_cep_fail(cep, rv);
	return xiw_cep_read_frame(cep);
}

static void xiw_cep_work(struct work_struct *w)
{
	struct xiw_cep *cep = container_of(to_delayed_work(w), struct xiw_cep,
					   work);
	struct sock *sk;
	int n = 0;

	mutex_lock(&cep->lock);
	switch (cep->state) {
	case XIW_CEP_LISTEN:
		xiw_cep_accept_all(cep);
		break;
	case XIW_CEP_CONNECTING:
		n = xiw_cep_tcp_up(cep);
		break;
	case XIW_CEP_AWAIT_REQ:
	case XIW_CEP_AWAIT_REPLY:
		n = xiw_cep_read_frame(cep);
		break;
	case XIW_CEP_AWAIT_ACCEPT:
	case XIW_CEP_AWAIT_TAKE:
	case XIW_CEP_TAKEN:
		/* The peer went while the application or provider decides. */
		if (cep->sock->sk->sk_state != TCP_ESTABLISHED)
			n = xiw_cep_fail(cep, -ECONNRESET);
		break;
	case XIW_CEP_CONNECTED:
		sk = cep->sock->sk;
		if (sk->sk_state == TCP_ESTABLISHED || sk->sk_state == TCP_FIN_WAIT1 ||
		    sk->sk_state == TCP_FIN_WAIT2)
			break;
		/*
		 * The peer closed (or reset) the stream, or both ends did: the
		 * connection manager hears of the disconnect and the close (it
		 * tells the application on the close); the stream stays the
		 * provider's.
		 */
		if (sk->sk_state == TCP_CLOSE_WAIT || sk->sk_state == TCP_LAST_ACK) {
			cep->disconnect_reported = true;
			xiw_cm_report(cep, cep->cm_id, IW_CM_EVENT_DISCONNECT, 0,
				      false);
		}
		xiw_cm_report(cep, cep->cm_id, IW_CM_EVENT_CLOSE,
			      sk->sk_state == TCP_CLOSE && !cep->disconnect_reported ?
			      -ECONNRESET : 0, false);
		n = xiw_cep_end(cep);
		break;
	case XIW_CEP_CLOSED:
		break;
	}
	mutex_unlock(&cep->lock);
	xiw_cep_put_n(cep, n + 1);
}

/* The QP `qpn` on `xdev`, if the calling process made it. */
static struct xiw_qp *xiw_cm_qp(struct xiw_device *xdev, u32 qpn)
{
	struct xiw_qp *qp = xa_load(&xdev->qps, qpn);

	if (!qp || !qp->uctx || !qp->base.res.task ||
	    !same_thread_group(qp->base.res.task, current))
		return NULL;
	return qp;
}

static int xiw_addr_len(const struct sockaddr_storage *a)
{
	return a->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
					  sizeof(struct sockaddr_in);
}

/*
 * A TCP socket of the caller's network namespace whose address may be
 * bound again at once: rdma_cm hands a port out again as soon as its last
 * ID is gone, while a connection of ours closed on it may still be in
 * TIME_WAIT. Accepted sockets take the setting from their listener.
 */
static int xiw_tcp_socket(sa_family_t family, struct socket **s)
{
	int rv = sock_create(family, SOCK_STREAM, IPPROTO_TCP, s);

	if (!rv)
		sock_set_reuseaddr((*s)->sk);
	return rv;
}

/*
 * Active: connects from the address the connection manager resolved to
 * wherever the routing table reaches (another device's address on this
 * host too, through the loopback), without waiting for it: the work sends
 * the MPA Request once the TCP connection is up, and the connection
 * manager hears how it went (CONNECT_REPLY), within XIW_MPA_TIMEOUT for
 * the TCP connection and as much again for the Reply.
 */
int xiw_iw_connect(struct iw_cm_id *id, struct iw_cm_conn_param *param)
{
	struct xiw_device *xdev = to_xdev(id->device);
	struct xiw_qp *qp = xiw_cm_qp(xdev, param->qpn);
	struct xiw_cep *cep;
	struct socket *s;
	int rv, n;

	if (!qp || param->private_data_len > MPA_MAX_PD - MPA_ENHANCED_LEN)
		return -EINVAL;
	rv = xiw_tcp_socket(id->remote_addr.ss_family, &s);
	if (rv)
		return rv;
	/* A send of the MPA Request waits no longer than a peer may take. */
	s->sk->sk_sndtimeo = XIW_MPA_TIMEOUT;
	rv = kernel_bind(s, XIW_SOCKADDR(&id->local_addr),
			 xiw_addr_len(&id->local_addr));
	if (rv) {
		sock_release(s);
		return rv;
	}
	tcp_sock_set_nodelay(s->sk);
	cep = xiw_cep_of_sock(xdev, s);
	if (!cep)
		return -ENOMEM;
	mutex_lock(&cep->lock);
	cep->active = true;
	cep->ird = min_t(u32, param->ird, XIW_MAX_RD_ATOMIC);
	cep->ord = min_t(u32, param->ord, XIW_MAX_RD_ATOMIC);
	cep->pdata_len = param->private_data_len;
	if (cep->pdata_len) {
		cep->pdata = kmemdup(param->private_data, cep->pdata_len,
				     GFP_KERNEL);
		if (!cep->pdata)
			rv = -ENOMEM;
	}
	if (!rv)
		rv = xiw_cep_claim(cep, qp);
	if (!rv) {
		/* Its state changes (up, refused, unreachable) queue the work. */
		xiw_cep_watch(cep, false);
		rv = kernel_connect(s, XIW_SOCKADDR(&id->remote_addr),
				    xiw_addr_len(&id->remote_addr), O_NONBLOCK);
		if (rv == -EINPROGRESS)
			rv = 0;
	}
	if (rv) {
		n = xiw_cep_end(cep);
		mutex_unlock(&cep->lock);
		xiw_cep_put_n(cep, n);
		return rv;
	}
	xiw_cep_bind(cep, id);
	cep->state = XIW_CEP_CONNECTING;
	cep->deadline = jiffies + XIW_MPA_TIMEOUT;
	/* It may be up already (the loopback is quick); else the deadline. */
	xiw_cep_kick(cep);
	mutex_unlock(&cep->lock);
	return 0;
}

/*
 * A reported connection the application does not take (rejected, or its
 * accept failed): ends the endpoint, with the reference its cm_id held
 * (provider_data, not yet bound), and unlocks it.
 */
static void xiw_cep_drop(struct xiw_cep *cep, struct iw_cm_id *id)
{
	int n = xiw_cep_end(cep);

	if (id->provider_data == cep) {
		id->provider_data = NULL;
		n++;
	}
	mutex_unlock(&cep->lock);
	xiw_cep_put_n(cep, n);
}

int xiw_iw_accept(struct iw_cm_id *id, struct iw_cm_conn_param *param)
{
	struct xiw_cep *cep = id->provider_data;
	struct xiw_device *xdev = to_xdev(id->device);
	struct xiw_qp *qp;
	int rv = -ECONNRESET;

	if (!cep)
		return -EINVAL;
	mutex_lock(&cep->lock);
	if (cep->state != XIW_CEP_AWAIT_ACCEPT)
		goto fail;
	qp = xiw_cm_qp(xdev, param->qpn);
	rv = -EINVAL;
	if (!qp || param->private_data_len > MPA_MAX_PD - MPA_ENHANCED_LEN)
		goto fail;
	rv = xiw_cep_claim(cep, qp);
	if (rv)
		goto fail;
	cep->ird = min_t(u32, param->ird, XIW_MAX_RD_ATOMIC);
	cep->ord = min_t(u32, min_t(u32, param->ord, XIW_MAX_RD_ATOMIC),
			 cep->peer_ird);
	/* The initiator's zero-length Read needs room to be answered. */
	if (cep->rtr == XIW_RTR_READ && !cep->ird)
		cep->ird = 1;
	rv = xiw_mpa_send(cep, mpa_rep_key, cep->crc ? MPA_FLAG_CRC : 0,
			  cep->ird | (cep->rtr ? MPA_P2P : 0) |
			  (cep->rtr == XIW_RTR_SEND ? MPA_RTR_SEND : 0),
			  cep->ord | (cep->rtr == XIW_RTR_WRITE ? MPA_RTR_WRITE :
				      cep->rtr == XIW_RTR_READ ? MPA_RTR_READ : 0),
			  param->private_data, param->private_data_len);
	if (rv)
		goto fail;
	xiw_cep_bind(cep, id);
	xiw_cep_ready(cep);
	/* The peer may have gone meanwhile: the work looks. */
	xiw_cep_kick(cep);
	mutex_unlock(&cep->lock);
	return 0;
fail:
	xiw_cep_drop(cep, id);
	return rv;
}

int xiw_iw_reject(struct iw_cm_id *id, const void *pdata, u8 len)
{
	struct xiw_cep *cep = id->provider_data;

	if (!cep)
		return -EINVAL;
	mutex_lock(&cep->lock);
	if (cep->state == XIW_CEP_AWAIT_ACCEPT)
		xiw_mpa_send(cep, mpa_rep_key, MPA_FLAG_REJECT, 0, 0, pdata, len);
	xiw_cep_drop(cep, id);
	return 0;
}

static bool xiw_addr_any(const struct sockaddr_storage *a)
{
	if (a->ss_family == AF_INET6)
		return ipv6_addr_any(&((const struct sockaddr_in6 *)a)->sin6_addr);
	return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
}

/*
 * A listen on an address listens there, whatever netdev a connection to it
 * comes through (the loopback, from another device of this host, too). A
 * listen on a wildcard address listens on the device's netdev only, as
 * Linux's siw does, so that devices on other netdevs (siw's too) can listen
 * on the same port; it takes connections to the netdev's addresses from
 * other hosts and from this host's own addresses on that netdev, not from
 * another netdev's (the kernel routes a netdev-bound listener's SYN-ACK
 * through that netdev only). A device whose netdev is in another network
 * namespace than the caller has no address there, and listens nowhere.
 */
int xiw_iw_create_listen(struct iw_cm_id *id, int backlog)
{
	struct xiw_device *xdev = to_xdev(id->device);
	struct xiw_cep *cep;
	struct socket *s;
	int rv;

	if (!net_eq(dev_net(xdev->ndev), current->nsproxy->net_ns))
		return 0;
	rv = xiw_tcp_socket(id->local_addr.ss_family, &s);
	if (rv)
		return rv;
	if (id->local_addr.ss_family == AF_INET6 && id->afonly)
		rv = ip6_sock_set_v6only(s->sk);
	if (!rv && xiw_addr_any(&id->local_addr))
		rv = sock_bindtoindex(s->sk, xdev->ndev->ifindex, true);
	if (!rv)
		rv = kernel_bind(s, XIW_SOCKADDR(&id->local_addr),
				 xiw_addr_len(&id->local_addr));
	if (!rv)
		rv = kernel_listen(s, backlog);
	if (rv) {
		sock_release(s);
		return rv;
	}
	cep = xiw_cep_of_sock(xdev, s);
	if (!cep)
		return -ENOMEM;
	mutex_lock(&cep->lock);
	cep->state = XIW_CEP_LISTEN;
	id->add_ref(id);
	cep->cm_id = id;
	kref_get(&cep->ref);
	id->provider_data = cep;
	xiw_cep_watch(cep, true);
	xiw_cep_kick(cep);
	mutex_unlock(&cep->lock);
	return 0;
}

int xiw_iw_destroy_listen(struct iw_cm_id *id)
{
	struct xiw_cep *cep = id->provider_data;
	struct xiw_cep *c;
	int n;

	if (!cep)
		return 0;
	mutex_lock(&cep->lock);
	cep->state = XIW_CEP_CLOSED;
	xiw_cep_unwatch(cep);
	mutex_unlock(&cep->lock);
	if (cancel_delayed_work_sync(&cep->work))
		xiw_cep_put(cep);
	/* Connections whose Request has not been reported end here. */
	for (;;) {
		mutex_lock(&cep->lock);
		c = list_first_entry_or_null(&cep->children, struct xiw_cep,
					     entry);
		if (c) {
			xiw_cep_orphan(c);
			kref_get(&c->ref);
		}
		mutex_unlock(&cep->lock);
		if (!c)
			break;
		xiw_cep_put(cep);
		if (cancel_delayed_work_sync(&c->work))
			xiw_cep_put(c);
		mutex_lock(&c->lock);
		n = xiw_cep_end(c);
		mutex_unlock(&c->lock);
		xiw_cep_put_n(c, n + 1);
	}
	mutex_lock(&cep->lock);
	n = xiw_cep_end(cep);
	mutex_unlock(&cep->lock);
	xiw_cep_put_n(cep, n);
	return 0;
}

/* The endpoint of QP `qp`, with a reference, if it has one. */
static struct xiw_cep *xiw_qp_cep(struct xiw_qp *qp)
{
	struct xiw_cep *cep;

	spin_lock(&qp->cep_lock);
	cep = qp->cep;
	if (cep)
		kref_get(&cep->ref);
	spin_unlock(&qp->cep_lock);
	return cep;
}

/*
 * The connection manager takes the QP down (rdma_disconnect, or the
 * connection's end): SQD ends the stream in order, ERR at once. The
 * provider, which owns the stream, sees it end.
 */
void xiw_cm_qp_down(struct xiw_qp *qp, enum ib_qp_state state)
{
	struct xiw_cep *cep = xiw_qp_cep(qp);

	if (!cep)
		return;
	mutex_lock(&cep->lock);
	if (cep->file && cep->sock)
		kernel_sock_shutdown(cep->sock,
				     state == IB_QPS_SQD ? SHUT_WR : SHUT_RDWR);
	mutex_unlock(&cep->lock);
	xiw_cep_put(cep);
}

/* The QP goes: its connection ends now, reported closed. */
void xiw_cm_qp_destroyed(struct xiw_qp *qp)
{
	struct xiw_cep *cep = xiw_qp_cep(qp);
	int n;

	if (!cep)
		return;
	if (cancel_delayed_work_sync(&cep->work))
		xiw_cep_put(cep);
	mutex_lock(&cep->lock);
	if (cep->state == XIW_CEP_CONNECTED) {
		xiw_cm_report(cep, cep->cm_id, IW_CM_EVENT_CLOSE, 0, false);
		n = xiw_cep_end(cep);
	} else {
		n = xiw_cep_fail(cep, -ECONNRESET);
	}
	mutex_unlock(&cep->lock);
	xiw_cep_put_n(cep, n + 1);
}

/*
 * The provider lets go of a stream it connected itself (it ends it, or
 * connects the QP anew): the module watches it no more and lets its socket
 * go. -EBUSY for a QP whose stream rdma_cm set up.
 */
int xiw_cm_qp_unshare(struct xiw_qp *qp)
{
	struct xiw_cep *cep = xiw_qp_cep(qp);
	int rv = 0, n = 0;

	if (!cep)
		return 0;
	mutex_lock(&cep->lock);
	if (cep->cm_id)
		rv = -EBUSY;
	else
		n = xiw_cep_end(cep);
	mutex_unlock(&cep->lock);
	xiw_cep_put_n(cep, n + 1);
	return rv;
}

/*
 * A stream the provider connected itself (modify_qp with the peer's address,
 * the MPA exchange its own) becomes one the module watches, as one it hands
 * over: its events marked in the QP's slot, its Writes placed while the
 * provider lends it. The module holds the socket's file until the stream
 * ends or the QP goes. A stream the QP had before ends first.
 */
int xiw_cm_qp_stream(struct xiw_qp *qp, int fd, bool crc)
{
	struct xiw_ucontext *uctx = qp->uctx;
	struct xiw_cep *cep;
	struct socket *sock;
	struct sock *sk;
	int rv, n = 0;

	if (!uctx || !uctx->events || qp->ev_slot < 0)
		return -EOPNOTSUPP;
	sock = sockfd_lookup(fd, &rv);
	if (!sock)
		return rv;
	sk = sock->sk;
	rv = -EINVAL;
	if (sock->type != SOCK_STREAM || sk->sk_protocol != IPPROTO_TCP ||
	    (sk->sk_family != AF_INET && sk->sk_family != AF_INET6))
		goto put;
	rv = -ENOTCONN;
	if (sk->sk_state != TCP_ESTABLISHED)
		goto put;
	rv = xiw_cm_qp_unshare(qp);
	if (rv)
		goto put;
	rv = -ENOMEM;
	cep = xiw_cep_alloc(to_xdev(qp->base.device));
	if (!cep)
		goto put;
	mutex_lock(&cep->lock);
	/* The lookup's reference to the file is the endpoint's now. */
	cep->sock = sock;
	cep->file = sock->file;
	cep->crc = crc;
	cep->state = XIW_CEP_CONNECTED;
	rv = xiw_cep_claim(cep, qp);
	if (!rv && !xiw_cep_watch(cep, false))
		rv = -EBUSY;
	if (!rv) {
		xiw_cep_stream(cep, uctx, qp->ev_slot);
		/* The peer may have gone meanwhile: the work looks. */
		xiw_cep_kick(cep);
	} else {
		n = xiw_cep_end(cep);
	}
	mutex_unlock(&cep->lock);
	xiw_cep_put_n(cep, n);
	return rv;
put:
	sockfd_put(sock);
	return rv;
}

/* The next endpoint of one of the context's lists, with the list's reference. */
static struct xiw_cep *xiw_uctx_pop(struct xiw_ucontext *uctx,
				    struct list_head *list)
{
	struct xiw_cep *cep;

	spin_lock(&uctx->lock);
	cep = list_first_entry_or_null(list, struct xiw_cep, entry);
	if (cep)
		list_del_init(&cep->entry);
	spin_unlock(&uctx->lock);
	return cep;
}

/*
 * Connections the provider took (and has made its QPs' streams since) are
 * reported established now: the application hears of a connection only
 * once the provider owns it.
 */
static void xiw_cm_report_taken(struct xiw_ucontext *uctx)
{
	struct xiw_cep *cep;

	while ((cep = xiw_uctx_pop(uctx, &uctx->taken))) {
		mutex_lock(&cep->lock);
		if (cep->state == XIW_CEP_TAKEN) {
			cep->state = XIW_CEP_CONNECTED;
			xiw_cm_report(cep, cep->cm_id, cep->active ?
				      IW_CM_EVENT_CONNECT_REPLY :
				      IW_CM_EVENT_ESTABLISHED, 0, cep->active);
			/* A disconnect that came meanwhile is seen now. */
			xiw_cep_kick(cep);
		}
		mutex_unlock(&cep->lock);
		xiw_cep_put(cep);
	}
}

/* The context goes: connections waiting for its provider fail. */
void xiw_cm_uctx_gone(struct xiw_ucontext *uctx)
{
	struct xiw_cep *cep;
	int n;

	for (;;) {
		cep = xiw_uctx_pop(uctx, &uctx->taken);
		if (!cep)
			cep = xiw_uctx_pop(uctx, &uctx->ready);
		if (!cep)
			break;
		mutex_lock(&cep->lock);
		n = xiw_cep_fail(cep, -ECONNRESET);
		mutex_unlock(&cep->lock);
		/* And the list's reference. */
		xiw_cep_put_n(cep, n + 1);
	}
}

/*
 * The provider takes the next connection of its context: the socket becomes
 * one of its descriptors, and the connection manager hears it is up.
 */
static int UVERBS_HANDLER(XIW_METHOD_TAKE_STREAM)(struct uverbs_attr_bundle *attrs)
{
	struct ib_ucontext *ibuctx = ib_uverbs_get_ucontext(attrs);
	struct xiw_stream out = {};
	struct xiw_ucontext *uctx;
	struct xiw_cep *cep;
	struct file *file;
	int fd, rv, n;

	if (IS_ERR(ibuctx))
		return PTR_ERR(ibuctx);
	uctx = container_of(ibuctx, struct xiw_ucontext, base);
	/* What the provider took before is its QPs' now: report it. */
	xiw_cm_report_taken(uctx);
	cep = xiw_uctx_pop(uctx, &uctx->ready);
	if (!cep)
		return -EAGAIN;

	/* The list's reference is this call's now. */
	mutex_lock(&cep->lock);
	rv = -ECONNRESET;
	if (cep->state != XIW_CEP_AWAIT_TAKE || !cep->qp)
		goto fail;
	fd = get_unused_fd_flags(O_CLOEXEC);
	if (fd < 0) {
		rv = fd;
		goto fail;
	}
	file = sock_alloc_file(cep->sock, O_NONBLOCK, NULL);
	if (IS_ERR(file)) {
		/* The socket went with the failure. */
		cep->sock = NULL;
		put_unused_fd(fd);
		rv = PTR_ERR(file);
		goto fail;
	}
	/* The module keeps a reference, to end the stream on disconnect. */
	cep->file = get_file(file);
	out.qpn = cep->qp->base.qp_num;
	out.fd = fd;
	out.ird = cep->ird;
	out.ord = cep->ord;
	out.peer_ird = cep->peer_ird;
	out.peer_ord = cep->peer_ord;
	out.initiator = cep->active;
	out.crc = cep->crc;
	out.rtr = cep->rtr;
	rv = uverbs_copy_to(attrs, XIW_ATTR_TAKE_STREAM_RESP, &out, sizeof(out));
	if (rv) {
		put_unused_fd(fd);
		fput(file);
		goto fail;
	}
	xiw_cep_stream(cep, uctx, cep->qp->ev_slot);
	fd_install(fd, file);
	/* Reported on the provider's next call, once its QP has the stream. */
	cep->state = XIW_CEP_TAKEN;
	spin_lock(&uctx->lock);
	list_add_tail(&cep->entry, &uctx->taken);
	spin_unlock(&uctx->lock);
	mutex_unlock(&cep->lock);
	/* The call's reference is the taken list's now. */
	return 0;
fail:
	n = xiw_cep_fail(cep, rv);
	mutex_unlock(&cep->lock);
	xiw_cep_put_n(cep, n + 1);
	return rv;
}

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_TAKE_STREAM,
			    UVERBS_ATTR_PTR_OUT(XIW_ATTR_TAKE_STREAM_RESP,
						UVERBS_ATTR_TYPE(struct xiw_stream),
						UA_MANDATORY));

ADD_UVERBS_METHODS(xiw_device_methods, UVERBS_OBJECT_DEVICE,
		   &UVERBS_METHOD(XIW_METHOD_TAKE_STREAM));

const struct uapi_definition xiw_cm_uapi_defs[] = {
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_DEVICE, &xiw_device_methods),
	{},
};

int xiw_cm_init(void)
{
	xiw_cm_wq = alloc_ordered_workqueue("xiw_cm", WQ_MEM_RECLAIM);
	return xiw_cm_wq ? 0 : -ENOMEM;
}

void xiw_cm_exit(void)
{
	destroy_workqueue(xiw_cm_wq);
}
