// SPDX-License-Identifier: GPL-2.0
/*
 * xiw: the device's verbs as the RDMA core sees them. The data path lives in
 * the provider; kernel consumers get -EOPNOTSUPP for it.
 */

#include <linux/module.h>
#include <linux/inetdevice.h>
#include <rdma/ib_verbs.h>
#include <rdma/ib_user_ioctl_verbs.h>

#include "xiw.h"

static int xiw_query_device(struct ib_device *ibdev,
			    struct ib_device_attr *attr,
			    struct ib_udata *udata)
{
	/* No udata at all when the core asks at registration (7.x). */
	if (udata && (udata->inlen || udata->outlen))
		return -EINVAL;

	memset(attr, 0, sizeof(*attr));
	attr->vendor_id = XIW_VENDOR_ID;
	attr->vendor_part_id = XIW_VENDOR_PART_ID;
	attr->sys_image_guid = ibdev->node_guid;
	attr->max_mr_size = ~0ull >> 1;
	attr->page_size_cap = PAGE_SIZE;
	attr->max_qp = XIW_MAX_QP;
	attr->max_qp_wr = XIW_MAX_QP_WR;
	attr->max_send_sge = XIW_MAX_SGE;
	attr->max_recv_sge = XIW_MAX_SGE;
	attr->max_sge_rd = XIW_MAX_SGE;
	attr->max_cq = XIW_MAX_QP * 2;
	attr->max_cqe = XIW_MAX_CQE;
	attr->max_mr = XIW_MAX_MR;
	attr->max_pd = XIW_MAX_PD;
	attr->max_qp_rd_atom = XIW_MAX_RD_ATOMIC;
	attr->max_qp_init_rd_atom = XIW_MAX_RD_ATOMIC;
	attr->max_res_rd_atom = XIW_MAX_QP * XIW_MAX_RD_ATOMIC;
	attr->max_srq = XIW_MAX_SRQ;
	attr->max_srq_wr = XIW_MAX_QP_WR;
	attr->max_srq_sge = XIW_MAX_SGE;
	/* `rdma link delete` may remove the device. */
	attr->kernel_cap_flags = IBK_ALLOW_USER_UNREG;
	return 0;
}

static int xiw_query_port(struct ib_device *ibdev, u32 port,
			  struct ib_port_attr *attr)
{
	struct xiw_device *xdev = to_xdev(ibdev);
	struct net_device *ndev = xdev->ndev;
	bool up = netif_running(ndev) && netif_carrier_ok(ndev);

	memset(attr, 0, sizeof(*attr));
	attr->state = up ? IB_PORT_ACTIVE : IB_PORT_DOWN;
	attr->phys_state = up ? IB_PORT_PHYS_STATE_LINK_UP :
				IB_PORT_PHYS_STATE_DISABLED;
	attr->max_mtu = ib_mtu_int_to_enum(ndev->mtu);
	attr->active_mtu = attr->max_mtu;
	attr->phys_mtu = ndev->mtu;
	attr->gid_tbl_len = XIW_GIDS;
	attr->port_cap_flags = IB_UVERBS_PCF_CM_SUP | IB_UVERBS_PCF_DEVICE_MGMT_SUP;
	attr->max_msg_sz = XIW_MAX_MSG_SZ;
	attr->pkey_tbl_len = 1;
	attr->active_width = IB_WIDTH_1X;
	attr->active_speed = IB_SPEED_QDR;
	return 0;
}

static int xiw_get_port_immutable(struct ib_device *ibdev, u32 port,
				  struct ib_port_immutable *imm)
{
	struct ib_port_attr attr;
	int rv;

	rv = ib_query_port(ibdev, port, &attr);
	if (rv)
		return rv;
	imm->gid_tbl_len = attr.gid_tbl_len;
	imm->pkey_tbl_len = attr.pkey_tbl_len;
	imm->core_cap_flags = RDMA_CORE_PORT_IWARP;
	return 0;
}

/*
 * GID 0 is the netdev's first IPv4 address (IPv4-mapped; all zero while it
 * has none): what programs that connect by modify_qp exchange and the
 * provider connects to, as in standalone mode. GID 1 is the netdev's
 * hardware address, as for any iWARP device: the connection manager looks
 * the device up by it.
 */
static int xiw_query_gid(struct ib_device *ibdev, u32 port, int index,
			 union ib_gid *gid)
{
	struct net_device *ndev = to_xdev(ibdev)->ndev;
	const struct in_ifaddr *ifa;
	struct in_device *in_dev;

	memset(gid, 0, sizeof(*gid));
	switch (index) {
	case XIW_GID_ADDR:
		rcu_read_lock();
		in_dev = __in_dev_get_rcu(ndev);
		if (in_dev) {
			ifa = rcu_dereference(in_dev->ifa_list);
			if (ifa) {
				gid->raw[10] = 0xff;
				gid->raw[11] = 0xff;
				memcpy(&gid->raw[12], &ifa->ifa_address, 4);
			}
		}
		rcu_read_unlock();
		return 0;
	case XIW_GID_MAC:
		memcpy(gid->raw, ndev->dev_addr,
		       min_t(unsigned int, ndev->addr_len, ETH_ALEN));
		return 0;
	default:
		return -EINVAL;
	}
}

static int xiw_query_pkey(struct ib_device *ibdev, u32 port, u16 index,
			  u16 *pkey)
{
	if (index != 0)
		return -EINVAL;
	*pkey = 0xffff;
	return 0;
}

static int xiw_alloc_ucontext(struct ib_ucontext *ibuctx, struct ib_udata *udata)
{
	struct xiw_ucontext *uctx = container_of(ibuctx, struct xiw_ucontext, base);
	struct xiw_device *xdev = to_xdev(ibuctx->device);
	struct xiw_alloc_ucontext_req req = { .cm_eventfd = -1 };
	struct xiw_alloc_ucontext_resp resp = {};
	int rv;

	if (udata->inlen &&
	    ib_copy_from_udata(&req, udata, min(udata->inlen, sizeof(req))))
		return -EFAULT;
	spin_lock_init(&uctx->lock);
	ida_init(&uctx->ev_ida);
	xiw_rings_init(uctx);
	INIT_LIST_HEAD(&uctx->ready);
	INIT_LIST_HEAD(&uctx->taken);
	if (req.cm_eventfd >= 0) {
		uctx->cm_ev = eventfd_ctx_fdget(req.cm_eventfd);
		if (IS_ERR(uctx->cm_ev)) {
			rv = PTR_ERR(uctx->cm_ev);
			uctx->cm_ev = NULL;
			return rv;
		}
		/* Stream events need the eventfd to wake the provider. */
		rv = xiw_events_alloc(uctx, &resp);
		if (rv)
			goto err;
	}
	if (udata->outlen >= sizeof(resp)) {
		rv = ib_copy_to_udata(udata, &resp, sizeof(resp));
		if (rv)
			goto err;
	}
	atomic_inc(&xdev->num_ctx);
	return 0;
err:
	xiw_events_free(uctx);
	if (uctx->cm_ev)
		eventfd_ctx_put(uctx->cm_ev);
	uctx->cm_ev = NULL;
	return rv;
}

/*
 * The device is going while a process still has it open (`rdma link
 * delete`, the netdev removed, rmmod): the core cuts the process off from
 * the device, and its objects are destroyed. The module has no mappings or
 * hardware to take back, so removal need not wait for the process to exit.
 */
static void xiw_disassociate_ucontext(struct ib_ucontext *uctx)
{
}

static void xiw_dealloc_ucontext(struct ib_ucontext *ibuctx)
{
	struct xiw_ucontext *uctx = container_of(ibuctx, struct xiw_ucontext, base);
	struct xiw_device *xdev = to_xdev(ibuctx->device);

	xiw_cm_uctx_gone(uctx);
	xiw_rings_free(uctx);
	xiw_events_free(uctx);
	if (uctx->cm_ev)
		eventfd_ctx_put(uctx->cm_ev);
	atomic_dec(&xdev->num_ctx);
}

static int xiw_alloc_pd(struct ib_pd *pd, struct ib_udata *udata)
{
	struct xiw_device *xdev = to_xdev(pd->device);

	if (!atomic_add_unless(&xdev->num_pd, 1, XIW_MAX_PD))
		return -ENOMEM;
	xiw_pd_init(to_xpd(pd));
	return 0;
}

static int xiw_dealloc_pd(struct ib_pd *pd, struct ib_udata *udata)
{
	struct xiw_device *xdev = to_xdev(pd->device);

	xiw_pd_fini(to_xpd(pd));
	atomic_dec(&xdev->num_pd);
	return 0;
}

/*
 * A CQ of the provider's: its completions are the provider's; the kernel's
 * object carries its completion channel (XIW_METHOD_CQ_NOTIFY signals it).
 * Queues, completion queues and memory live in the provider: kernel
 * consumers cannot have them.
 */
#ifdef XIW_CREATE_CQ_ATTRS
/* Newer kernels pass the whole attribute bundle (Kbuild tells). */
static int xiw_create_cq(struct ib_cq *cq, const struct ib_cq_init_attr *attr,
			 struct uverbs_attr_bundle *attrs)
{
	struct ib_udata *udata = attrs ? &attrs->driver_udata : NULL;
#else
static int xiw_create_cq(struct ib_cq *cq, const struct ib_cq_init_attr *attr,
			 struct ib_udata *udata)
{
#endif
	struct xiw_device *xdev = to_xdev(cq->device);

	if (!udata || attr->flags)
		return -EOPNOTSUPP;
	if (attr->cqe < 1 || attr->cqe > XIW_MAX_CQE ||
	    attr->comp_vector >= cq->device->num_comp_vectors)
		return -EINVAL;
	if (!atomic_add_unless(&xdev->num_cq, 1, XIW_MAX_QP * 2))
		return -ENOMEM;
	cq->cqe = attr->cqe;
	RCU_INIT_POINTER(to_xcq(cq)->arm, NULL);
	to_xcq(cq)->ring = NULL;
	return 0;
}

static int xiw_destroy_cq(struct ib_cq *cq, struct ib_udata *udata)
{
	struct xiw_device *xdev = to_xdev(cq->device);

	xiw_cq_ring_put(to_xcq(cq));
	atomic_dec(&xdev->num_cq);
	return 0;
}

/*
 * A QP of the provider's, under the number it chose (struct
 * xiw_create_qp_req): the connection manager finds it by that number, which
 * the provider's own connections use too.
 */
static int xiw_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr,
			 struct ib_udata *udata)
{
	struct xiw_device *xdev = to_xdev(ibqp->device);
	struct xiw_qp *qp = to_xqp(ibqp);
	struct xiw_create_qp_resp resp = {};
	struct xiw_create_qp_req req;
	int rv;

	qp->ev_slot = -1;
	qp->uctx = NULL;
	if (!udata || attr->qp_type != IB_QPT_RC || attr->create_flags)
		return -EOPNOTSUPP;
	if (udata->inlen < sizeof(req))
		return -EINVAL;
	if (ib_copy_from_udata(&req, udata, sizeof(req)))
		return -EFAULT;
	if (!req.qpn || req.qpn > 0xffffff || req.reserved ||
	    attr->cap.max_send_wr > XIW_MAX_QP_WR ||
	    attr->cap.max_recv_wr > XIW_MAX_QP_WR ||
	    attr->cap.max_send_sge > XIW_MAX_SGE ||
	    attr->cap.max_recv_sge > XIW_MAX_SGE ||
	    attr->cap.max_inline_data > XIW_MAX_INLINE)
		return -EINVAL;
	if (!atomic_add_unless(&xdev->num_qp, 1, XIW_MAX_QP))
		return -ENOMEM;
	refcount_set(&qp->refs, 1);
	init_completion(&qp->unused);
	qp->state = IB_QPS_RESET;
	spin_lock_init(&qp->cep_lock);
	qp->cep = NULL;
	qp->uctx = rdma_udata_to_drv_context(udata, struct xiw_ucontext, base);
	qp->cap = attr->cap;
	qp->sq_sig_all = attr->sq_sig_type == IB_SIGNAL_ALL_WR;
	ibqp->qp_num = req.qpn;
	ibqp->port = 1;
	qp->ev_slot = xiw_events_slot_get(qp->uctx);
	resp.events_slot = qp->ev_slot < 0 ? U32_MAX : qp->ev_slot;
	if (udata->outlen >= sizeof(resp)) {
		rv = ib_copy_to_udata(udata, &resp, sizeof(resp));
		if (rv)
			goto err;
	}
	rv = xa_insert_irq(&xdev->qps, req.qpn, qp, GFP_KERNEL);
	if (rv)
		goto err;
	return 0;
err:
	xiw_events_slot_put(qp->uctx, qp->ev_slot);
	atomic_dec(&xdev->num_qp);
	return rv == -EBUSY ? -EEXIST : rv;
}

static void xiw_qp_add_ref(struct ib_qp *ibqp)
{
	refcount_inc(&to_xqp(ibqp)->refs);
}

static void xiw_qp_rem_ref(struct ib_qp *ibqp)
{
	struct xiw_qp *qp = to_xqp(ibqp);

	if (refcount_dec_and_test(&qp->refs))
		complete(&qp->unused);
}

/* Called with a spinlock held and interrupts off: no sleeping. */
static struct ib_qp *xiw_get_qp(struct ib_device *ibdev, int qpn)
{
	struct xiw_qp *qp = xa_load(&to_xdev(ibdev)->qps, qpn);

	return qp ? &qp->base : NULL;
}

/*
 * The provider reports the states its QP moves to (the state alone): the
 * kernel's QP only mirrors it.
 */
static int xiw_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
			 int mask, struct ib_udata *udata)
{
	struct xiw_qp *qp = to_xqp(ibqp);

	if (!(mask & IB_QP_STATE) || attr->qp_state > IB_QPS_ERR)
		return -EINVAL;
	if (!udata) {
		/* The connection manager ends the connection (SQD, ERR). */
		if (attr->qp_state == IB_QPS_SQD || attr->qp_state == IB_QPS_ERR)
			xiw_cm_qp_down(qp, attr->qp_state);
	} else if (mask != IB_QP_STATE) {
		return -EOPNOTSUPP;
	}
	WRITE_ONCE(qp->state, attr->qp_state);
	return 0;
}

static int xiw_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
			int mask, struct ib_qp_init_attr *init)
{
	struct xiw_qp *qp = to_xqp(ibqp);

	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	attr->qp_state = READ_ONCE(qp->state);
	attr->cur_qp_state = attr->qp_state;
	attr->cap = qp->cap;
	attr->port_num = 1;
	init->event_handler = ibqp->event_handler;
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	init->cap = qp->cap;
	init->sq_sig_type = qp->sq_sig_all ? IB_SIGNAL_ALL_WR : IB_SIGNAL_REQ_WR;
	init->qp_type = IB_QPT_RC;
	init->port_num = 1;
	return 0;
}

/* The core frees the QP on return: wait for the connection manager's hold. */
static int xiw_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct xiw_device *xdev = to_xdev(ibqp->device);
	struct xiw_qp *qp = to_xqp(ibqp);

	xiw_cm_qp_destroyed(qp);
	xa_erase_irq(&xdev->qps, ibqp->qp_num);
	xiw_qp_rem_ref(ibqp);
	wait_for_completion(&qp->unused);
	xiw_events_slot_put(qp->uctx, qp->ev_slot);
	atomic_dec(&xdev->num_qp);
	return 0;
}

static int xiw_create_srq(struct ib_srq *srq, struct ib_srq_init_attr *attr,
			  struct ib_udata *udata)
{
	struct xiw_device *xdev = to_xdev(srq->device);

	if (!udata || attr->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	if (attr->attr.max_wr > XIW_MAX_QP_WR || attr->attr.max_sge > XIW_MAX_SGE)
		return -EINVAL;
	if (!atomic_add_unless(&xdev->num_srq, 1, XIW_MAX_SRQ))
		return -ENOMEM;
	return 0;
}

static int xiw_destroy_srq(struct ib_srq *srq, struct ib_udata *udata)
{
	atomic_dec(&to_xdev(srq->device)->num_srq);
	return 0;
}

static int xiw_post_send(struct ib_qp *qp, const struct ib_send_wr *wr,
			 const struct ib_send_wr **bad)
{
	*bad = wr;
	return -EOPNOTSUPP;
}

static int xiw_post_recv(struct ib_qp *qp, const struct ib_recv_wr *wr,
			 const struct ib_recv_wr **bad)
{
	*bad = wr;
	return -EOPNOTSUPP;
}

static int xiw_poll_cq(struct ib_cq *cq, int n, struct ib_wc *wc)
{
	return -EOPNOTSUPP;
}

static int xiw_req_notify_cq(struct ib_cq *cq, enum ib_cq_notify_flags flags)
{
	return -EOPNOTSUPP;
}

static struct ib_mr *xiw_get_dma_mr(struct ib_pd *pd, int access)
{
	return ERR_PTR(-EOPNOTSUPP);
}

/*
 * A region the provider registered (and checks every access to): the
 * kernel's object stands for it (`rdma resource`, its PD in use); its keys
 * are the provider's STag. Pinned for placement if the provider asks and
 * the peer may write it (xiw_place.c); a region that cannot be pinned is
 * registered all the same, and the provider places for it.
 */
static struct ib_mr *xiw_reg_user_mr(struct ib_pd *pd, u64 start, u64 len,
				     u64 iova, int access,
				     struct ib_udata *udata)
{
	struct xiw_device *xdev = to_xdev(pd->device);
	struct xiw_reg_mr_req req;
	struct xiw_mr *mr;

	if (!udata)
		return ERR_PTR(-EOPNOTSUPP);
	if (udata->inlen < sizeof(req))
		return ERR_PTR(-EINVAL);
	if (ib_copy_from_udata(&req, udata, sizeof(req)))
		return ERR_PTR(-EFAULT);
	if (req.flags & ~XIW_REG_MR_PLACE)
		return ERR_PTR(-EINVAL);
	if (!atomic_add_unless(&xdev->num_mr, 1, XIW_MAX_MR))
		return ERR_PTR(-ENOMEM);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr) {
		atomic_dec(&xdev->num_mr);
		return ERR_PTR(-ENOMEM);
	}
	mr->base.lkey = req.stag;
	mr->base.rkey = req.stag;
	mr->base.pd = pd;
	mr->access = access;
	if ((req.flags & XIW_REG_MR_PLACE) && (access & IB_ACCESS_LOCAL_WRITE))
		xiw_mr_pin(mr, start, len, req.iova);
	return &mr->base;
}

#ifdef XIW_REG_USER_MR_DMAH
/* Kernels that pass a DMA handle: xiw offers none, so there is never one. */
static struct ib_mr *xiw_reg_user_mr_dmah(struct ib_pd *pd, u64 start, u64 len,
					  u64 iova, int access,
					  struct ib_dmah *dmah,
					  struct ib_udata *udata)
{
	if (dmah)
		return ERR_PTR(-EOPNOTSUPP);
	return xiw_reg_user_mr(pd, start, len, iova, access, udata);
}
#endif

static int xiw_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct xiw_device *xdev = to_xdev(ibmr->device);
	struct xiw_mr *mr = to_xmr(ibmr);

	xiw_mr_unplace(mr);
	kfree_rcu(mr, rcu);
	atomic_dec(&xdev->num_mr);
	return 0;
}

/*
 * The last reference to an unregistered device is gone: the core frees it
 * (and drops its netdev) right after this.
 */
static void xiw_dealloc_driver(struct ib_device *ibdev)
{
	struct xiw_device *xdev = to_xdev(ibdev);

	WARN_ON(atomic_read(&xdev->num_ctx) || atomic_read(&xdev->num_pd) ||
		atomic_read(&xdev->num_cq) || atomic_read(&xdev->num_qp) ||
		atomic_read(&xdev->num_srq) || atomic_read(&xdev->num_mr));
	WARN_ON(!xa_empty(&xdev->qps));
	xa_destroy(&xdev->qps);
}

const struct ib_device_ops xiw_device_ops = {
	.owner = THIS_MODULE,
	.driver_id = XIW_DRIVER_ID,
	.uverbs_abi_ver = XIW_UVERBS_ABI_VERSION,

	.alloc_pd = xiw_alloc_pd,
	.alloc_ucontext = xiw_alloc_ucontext,
	.create_cq = xiw_create_cq,
	.create_qp = xiw_create_qp,
	.create_srq = xiw_create_srq,
	.dealloc_driver = xiw_dealloc_driver,
	.dealloc_pd = xiw_dealloc_pd,
	.dealloc_ucontext = xiw_dealloc_ucontext,
	.dereg_mr = xiw_dereg_mr,
	.destroy_cq = xiw_destroy_cq,
	.destroy_qp = xiw_destroy_qp,
	.destroy_srq = xiw_destroy_srq,
	.disassociate_ucontext = xiw_disassociate_ucontext,
	.get_dma_mr = xiw_get_dma_mr,
	.get_port_immutable = xiw_get_port_immutable,
	.iw_accept = xiw_iw_accept,
	.iw_add_ref = xiw_qp_add_ref,
	.iw_connect = xiw_iw_connect,
	.iw_create_listen = xiw_iw_create_listen,
	.iw_destroy_listen = xiw_iw_destroy_listen,
	.iw_get_qp = xiw_get_qp,
	.iw_reject = xiw_iw_reject,
	.iw_rem_ref = xiw_qp_rem_ref,
	.mmap = xiw_mmap,
	.mmap_free = xiw_mmap_free,
	.modify_qp = xiw_modify_qp,
	.poll_cq = xiw_poll_cq,
	.post_recv = xiw_post_recv,
	.post_send = xiw_post_send,
	.query_device = xiw_query_device,
	.query_gid = xiw_query_gid,
	.query_pkey = xiw_query_pkey,
	.query_qp = xiw_query_qp,
	.query_port = xiw_query_port,
#ifdef XIW_REG_USER_MR_DMAH
	.reg_user_mr = xiw_reg_user_mr_dmah,
#else
	.reg_user_mr = xiw_reg_user_mr,
#endif
	.req_notify_cq = xiw_req_notify_cq,

	INIT_RDMA_OBJ_SIZE(ib_cq, xiw_cq, base),
	INIT_RDMA_OBJ_SIZE(ib_pd, xiw_pd, base),
	INIT_RDMA_OBJ_SIZE(ib_qp, xiw_qp, base),
	INIT_RDMA_OBJ_SIZE(ib_srq, xiw_srq, base),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, xiw_ucontext, base),
};
