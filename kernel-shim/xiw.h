/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xiw: the kernel side of the xiw software iWARP device.
 *
 * The module registers xiw devices with the RDMA core, so that discovery,
 * completion channels and the connection manager work for unmodified
 * programs. The provider in user space runs the protocol over the connected
 * socket; the module's one part in the data path is placing RDMA Writes from
 * the socket of a stream the provider lends it (xiw_place.c), and waking
 * an armed CQ's completion channel there when a message that completes a
 * receive has come (xiw_cq_event()).
 */
#ifndef XIW_H
#define XIW_H

#include <linux/netdevice.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>
#include <rdma/iw_cm.h>
#include <linux/eventfd.h>
#include <linux/hrtimer.h>
#include <linux/idr.h>

#include "xiw_abi.h"

#define XIW_DRIVER_ID ((enum rdma_driver_id)XIW_KERNEL_DRIVER_ID)

/* The address type kernel_bind() and kernel_connect() take. */
#ifdef XIW_SOCKADDR_UNSIZED
#define XIW_SOCKADDR(a) ((struct sockaddr_unsized *)(a))
#else
#define XIW_SOCKADDR(a) ((struct sockaddr *)(a))
#endif

/* The port's GIDs: its IPv4 address, then its hardware address. */
enum {
	XIW_GID_ADDR,
	XIW_GID_MAC,
	XIW_GIDS,
};

struct xiw_device {
	struct ib_device ibdev;
	/* The netdev the device is bound to (a reference is held by the core). */
	struct net_device *ndev;
	/* QPs by number, for the connection manager (iw_get_qp). */
	struct xarray qps;
	atomic_t num_ctx;
	atomic_t num_pd;
	atomic_t num_cq;
	atomic_t num_qp;
	atomic_t num_srq;
	atomic_t num_mr;
};

struct xiw_ucontext {
	struct ib_ucontext base;
	/* Connections set up for its QPs, MPA done, for the provider to take. */
	spinlock_t lock;
	struct list_head ready;
	/* Taken by the provider, reported on its next call. */
	struct list_head taken;
	/*
	 * The provider's eventfd, signalled when one is added, and when its
	 * progress thread sleeps and a stream has events (xiw_events.c).
	 */
	struct eventfd_ctx *cm_ev;
	/* The events page (NULL: none), its mapping, and its slots in use. */
	void *events;
	struct rdma_user_mmap_entry *ev_entry;
	struct ida ev_ida;
	/* The rings the provider asked for (XIW_METHOD_RING_ALLOC). */
	struct mutex rings_lock;
	struct list_head rings;
	u32 nr_rings;
};

/* Where a stream's socket callbacks mark its events. */
struct xiw_stream_ev {
	struct xiw_ucontext *uctx;	/* NULL: not marked */
	u32 slot;
	struct hrtimer timer;
	/* Its QP's PD and whether it has CRC, for placement (xiw_place.c). */
	struct ib_pd *pd;
	bool crc;
	/* Its QP's receive CQ, whose channel a Send's arrival may signal. */
	struct ib_cq *rcq;
};

struct xiw_pd {
	struct ib_pd base;
	/* Its regions pinned for placement, by STag (xiw_place.c). */
	struct xarray mrs;
};

/*
 * A region. The kernel's object stands for the provider's (`rdma
 * resource`, the PD's use count); its keys are the provider's STag. With
 * `pages` it is pinned for placement and in its PD's table: `users` counts
 * the table's reference and each placement under way, `idle` completes
 * when the last goes; freed after an RCU grace period (placement looks it
 * up under RCU).
 */
struct xiw_mr {
	struct ib_mr base;
	u32 access;
	struct page **pages;
	unsigned long npages;
	unsigned long first;	/* offset of the first byte in pages[0] */
	u64 iova;		/* the TO of the first byte */
	u64 len;
	struct mm_struct *mm;	/* whose locked memory the pages count in */
	refcount_t users;
	struct completion idle;
	struct rcu_head rcu;
};

/*
 * A CQ. `arm` is the arm word of its ring once the provider named the ring
 * (XIW_METHOD_CQ_RING), read under RCU; `ring` holds the ring's memory
 * (its mapping entry's reference) while `arm` points into it.
 */
struct xiw_cq {
	struct ib_cq base;
	u32 __rcu *arm;
	struct rdma_user_mmap_entry *ring;
};

struct xiw_qp {
	struct ib_qp base;
	/* The QP's own reference and the connection manager's. */
	refcount_t refs;
	struct completion unused;
	/* The state the provider last reported, and the sizes it was made with. */
	enum ib_qp_state state;
	struct ib_qp_cap cap;
	bool sq_sig_all;
	/* Its connection manager endpoint, if rdma_cm connects it. */
	spinlock_t cep_lock;
	struct xiw_cep *cep;
	/* The context that made it, and the QP's slot in its events page. */
	struct xiw_ucontext *uctx;
	int ev_slot;
};

struct xiw_srq {
	struct ib_srq base;
};

static inline struct xiw_pd *to_xpd(struct ib_pd *pd)
{
	return container_of(pd, struct xiw_pd, base);
}

static inline struct xiw_mr *to_xmr(struct ib_mr *mr)
{
	return container_of(mr, struct xiw_mr, base);
}

static inline struct xiw_cq *to_xcq(struct ib_cq *cq)
{
	return container_of(cq, struct xiw_cq, base);
}

static inline struct xiw_qp *to_xqp(struct ib_qp *qp)
{
	return container_of(qp, struct xiw_qp, base);
}

static inline struct xiw_device *to_xdev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct xiw_device, ibdev);
}

/* xiw_verbs.c */
extern const struct ib_device_ops xiw_device_ops;

/* xiw_uapi.c */
extern const struct uapi_definition xiw_uapi_defs[];

/* xiw_events.c */
int xiw_events_alloc(struct xiw_ucontext *uctx,
		     struct xiw_alloc_ucontext_resp *resp);
void xiw_events_free(struct xiw_ucontext *uctx);
int xiw_mmap(struct ib_ucontext *ibuctx, struct vm_area_struct *vma);
void xiw_mmap_free(struct rdma_user_mmap_entry *rdma);
int xiw_events_slot_get(struct xiw_ucontext *uctx);
void xiw_events_slot_put(struct xiw_ucontext *uctx, int slot);
void xiw_events_note_cm(struct xiw_ucontext *uctx);
void xiw_rings_init(struct xiw_ucontext *uctx);
void xiw_rings_free(struct xiw_ucontext *uctx);
extern const struct uapi_definition xiw_ring_uapi_defs[];
void xiw_stream_mark(struct xiw_stream_ev *ev, u32 bits);
void xiw_stream_mark_for_app(struct xiw_stream_ev *ev, u32 bits);
int xiw_cq_ring_set(struct xiw_ucontext *uctx, struct xiw_cq *cq, u64 off);
void xiw_cq_ring_put(struct xiw_cq *cq);
bool xiw_cq_event(struct ib_cq *cq, bool solicited, struct xiw_stream_ev *ev);
void xiw_stream_ev_init(struct xiw_stream_ev *ev);
void xiw_stream_ev_stop(struct xiw_stream_ev *ev);

struct xiw_events_slot *xiw_stream_slot(struct xiw_stream_ev *ev);
void xiw_stream_place_reset(struct xiw_stream_ev *ev);

/* xiw_place.c */
void xiw_pd_init(struct xiw_pd *pd);
void xiw_pd_fini(struct xiw_pd *pd);
int xiw_mr_pin(struct xiw_mr *mr, u64 start, u64 len, u64 iova);
void xiw_mr_unplace(struct xiw_mr *mr);
int xiw_place_stream(struct sock *sk, struct xiw_stream_ev *ev);

/* What xiw_place_stream() leaves for the provider. */
enum {
	XIW_PLACE_ALL,		/* nothing: all that came was placed */
	XIW_PLACE_LEFT,		/* bytes to read */
	XIW_PLACE_LEFT_SIGNALLED, /* ... and the completion channel is woken */
};

extern const struct uapi_definition xiw_place_uapi_defs[];

/* xiw_cm.c */
struct xiw_cep;
int xiw_iw_connect(struct iw_cm_id *id, struct iw_cm_conn_param *param);
int xiw_iw_accept(struct iw_cm_id *id, struct iw_cm_conn_param *param);
int xiw_iw_reject(struct iw_cm_id *id, const void *pdata, u8 len);
int xiw_cm_qp_stream(struct xiw_qp *qp, int fd, bool crc);
int xiw_cm_qp_unshare(struct xiw_qp *qp);
int xiw_iw_create_listen(struct iw_cm_id *id, int backlog);
int xiw_iw_destroy_listen(struct iw_cm_id *id);
void xiw_cm_qp_down(struct xiw_qp *qp, enum ib_qp_state state);
void xiw_cm_qp_destroyed(struct xiw_qp *qp);
void xiw_cm_uctx_gone(struct xiw_ucontext *uctx);
extern const struct uapi_definition xiw_cm_uapi_defs[];
int xiw_cm_init(void);
void xiw_cm_exit(void);

static inline void xiw_eventfd_signal(struct eventfd_ctx *ev)
{
#ifdef XIW_EVENTFD_SIGNAL_1
	eventfd_signal(ev);
#else
	eventfd_signal(ev, 1);
#endif
}

#endif /* XIW_H */
