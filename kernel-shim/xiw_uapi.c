// SPDX-License-Identifier: GPL-2.0
/*
 * xiw: the module's own uverbs methods, called by the provider on objects
 * of its own context (the core looks each handle up in the caller's file,
 * holds the object against a concurrent destroy and refuses another
 * process's).
 */

#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#define UVERBS_MODULE_NAME xiw_ib
#include <rdma/uverbs_named_ioctl.h>

#include "xiw.h"

/*
 * The provider wrote a completion to a CQ the application armed: wake its
 * completion channel, as an RNIC's interrupt would.
 */
static int UVERBS_HANDLER(XIW_METHOD_CQ_NOTIFY)(struct uverbs_attr_bundle *attrs)
{
	struct ib_cq *cq = uverbs_attr_get_obj(attrs, XIW_ATTR_CQ_NOTIFY_HANDLE);

	if (IS_ERR(cq))
		return PTR_ERR(cq);
	if (cq->comp_handler)
		cq->comp_handler(cq, cq->cq_context);
	return 0;
}

/*
 * The CQ's ring is the context's ring at this offset: the module may signal
 * its channel from the socket's receive path (xiw_cq_event()).
 */
static int UVERBS_HANDLER(XIW_METHOD_CQ_RING)(struct uverbs_attr_bundle *attrs)
{
	struct ib_cq *cq = uverbs_attr_get_obj(attrs, XIW_ATTR_CQ_RING_HANDLE);
	struct ib_ucontext *ibuctx = ib_uverbs_get_ucontext(attrs);
	u64 off;
	int rv;

	if (IS_ERR(cq))
		return PTR_ERR(cq);
	if (IS_ERR(ibuctx))
		return PTR_ERR(ibuctx);
	rv = uverbs_get_const(&off, attrs, XIW_ATTR_CQ_RING_OFFSET);
	if (rv)
		return rv;
	return xiw_cq_ring_set(container_of(ibuctx, struct xiw_ucontext, base),
			       to_xcq(cq), off);
}

/*
 * The provider connected the QP's stream itself (modify_qp): the module
 * watches it from now on, as a stream it handed over (xiw_cm_qp_stream());
 * or, descriptor XIW_QP_STREAM_NONE, no more (xiw_cm_qp_unshare()).
 */
static int UVERBS_HANDLER(XIW_METHOD_QP_STREAM)(struct uverbs_attr_bundle *attrs)
{
	struct ib_qp *qp = uverbs_attr_get_obj(attrs, XIW_ATTR_QP_STREAM_HANDLE);
	u32 fd, flags;
	int rv;

	if (IS_ERR(qp))
		return PTR_ERR(qp);
	rv = uverbs_get_const(&fd, attrs, XIW_ATTR_QP_STREAM_FD);
	if (!rv)
		rv = uverbs_get_const(&flags, attrs, XIW_ATTR_QP_STREAM_FLAGS);
	if (rv)
		return rv;
	if (flags & ~XIW_QP_STREAM_CRC)
		return -EINVAL;
	if (fd == XIW_QP_STREAM_NONE)
		return xiw_cm_qp_unshare(to_xqp(qp));
	if (fd > INT_MAX)
		return -EBADF;
	return xiw_cm_qp_stream(to_xqp(qp), fd, flags & XIW_QP_STREAM_CRC);
}

static const enum ib_event_type xiw_qp_events[] = {
	IB_EVENT_QP_FATAL, IB_EVENT_QP_REQ_ERR, IB_EVENT_QP_ACCESS_ERR,
	IB_EVENT_COMM_EST, IB_EVENT_SQ_DRAINED, IB_EVENT_QP_LAST_WQE_REACHED,
};

static const enum ib_event_type xiw_cq_events[] = { IB_EVENT_CQ_ERR };

static const enum ib_event_type xiw_srq_events[] = {
	IB_EVENT_SRQ_ERR, IB_EVENT_SRQ_LIMIT_REACHED,
};

/*
 * The event the provider asks for, on an object of `dev`, into `ev`, if it
 * is one of `allowed` (those its kind of object has).
 */
static int xiw_event(struct uverbs_attr_bundle *attrs, struct ib_device *dev,
		     const enum ib_event_type *allowed, int n,
		     struct ib_event *ev)
{
	u32 type;
	int i, rv;

	rv = uverbs_get_const(&type, attrs, XIW_ATTR_EVENT_TYPE);
	if (rv)
		return rv;
	for (i = 0; i < n; i++) {
		if (type == allowed[i]) {
			ev->device = dev;
			ev->event = type;
			return 0;
		}
	}
	return -EINVAL;
}

static int UVERBS_HANDLER(XIW_METHOD_QP_EVENT)(struct uverbs_attr_bundle *attrs)
{
	struct ib_qp *qp = uverbs_attr_get_obj(attrs, XIW_ATTR_EVENT_HANDLE);
	struct ib_event ev = {};
	int rv;

	if (IS_ERR(qp))
		return PTR_ERR(qp);
	rv = xiw_event(attrs, qp->device, xiw_qp_events,
		       ARRAY_SIZE(xiw_qp_events), &ev);
	if (rv)
		return rv;
	ev.element.qp = qp;
	if (qp->event_handler)
		qp->event_handler(&ev, qp->qp_context);
	return 0;
}

static int UVERBS_HANDLER(XIW_METHOD_CQ_EVENT)(struct uverbs_attr_bundle *attrs)
{
	struct ib_cq *cq = uverbs_attr_get_obj(attrs, XIW_ATTR_EVENT_HANDLE);
	struct ib_event ev = {};
	int rv;

	if (IS_ERR(cq))
		return PTR_ERR(cq);
	rv = xiw_event(attrs, cq->device, xiw_cq_events,
		       ARRAY_SIZE(xiw_cq_events), &ev);
	if (rv)
		return rv;
	ev.element.cq = cq;
	if (cq->event_handler)
		cq->event_handler(&ev, cq->cq_context);
	return 0;
}

static int UVERBS_HANDLER(XIW_METHOD_SRQ_EVENT)(struct uverbs_attr_bundle *attrs)
{
	struct ib_srq *srq = uverbs_attr_get_obj(attrs, XIW_ATTR_EVENT_HANDLE);
	struct ib_event ev = {};
	int rv;

	if (IS_ERR(srq))
		return PTR_ERR(srq);
	rv = xiw_event(attrs, srq->device, xiw_srq_events,
		       ARRAY_SIZE(xiw_srq_events), &ev);
	if (rv)
		return rv;
	ev.element.srq = srq;
	if (srq->event_handler)
		srq->event_handler(&ev, srq->srq_context);
	return 0;
}

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_CQ_NOTIFY,
			    UVERBS_ATTR_IDR(XIW_ATTR_CQ_NOTIFY_HANDLE,
					    UVERBS_OBJECT_CQ,
					    UVERBS_ACCESS_READ,
					    UA_MANDATORY));

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_CQ_RING,
			    UVERBS_ATTR_IDR(XIW_ATTR_CQ_RING_HANDLE,
					    UVERBS_OBJECT_CQ,
					    UVERBS_ACCESS_WRITE,
					    UA_MANDATORY),
			    UVERBS_ATTR_CONST_IN(XIW_ATTR_CQ_RING_OFFSET, u64,
						 UA_MANDATORY));

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_CQ_EVENT,
			    UVERBS_ATTR_IDR(XIW_ATTR_EVENT_HANDLE,
					    UVERBS_OBJECT_CQ,
					    UVERBS_ACCESS_READ,
					    UA_MANDATORY),
			    UVERBS_ATTR_CONST_IN(XIW_ATTR_EVENT_TYPE, u32,
						 UA_MANDATORY));

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_QP_EVENT,
			    UVERBS_ATTR_IDR(XIW_ATTR_EVENT_HANDLE,
					    UVERBS_OBJECT_QP,
					    UVERBS_ACCESS_READ,
					    UA_MANDATORY),
			    UVERBS_ATTR_CONST_IN(XIW_ATTR_EVENT_TYPE, u32,
						 UA_MANDATORY));

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_SRQ_EVENT,
			    UVERBS_ATTR_IDR(XIW_ATTR_EVENT_HANDLE,
					    UVERBS_OBJECT_SRQ,
					    UVERBS_ACCESS_READ,
					    UA_MANDATORY),
			    UVERBS_ATTR_CONST_IN(XIW_ATTR_EVENT_TYPE, u32,
						 UA_MANDATORY));

ADD_UVERBS_METHODS(xiw_cq_methods, UVERBS_OBJECT_CQ,
		   &UVERBS_METHOD(XIW_METHOD_CQ_NOTIFY),
		   &UVERBS_METHOD(XIW_METHOD_CQ_EVENT),
		   &UVERBS_METHOD(XIW_METHOD_CQ_RING));

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_QP_STREAM,
			    UVERBS_ATTR_IDR(XIW_ATTR_QP_STREAM_HANDLE,
					    UVERBS_OBJECT_QP,
					    UVERBS_ACCESS_WRITE,
					    UA_MANDATORY),
			    UVERBS_ATTR_CONST_IN(XIW_ATTR_QP_STREAM_FD, u32,
						 UA_MANDATORY),
			    UVERBS_ATTR_CONST_IN(XIW_ATTR_QP_STREAM_FLAGS, u32,
						 UA_MANDATORY));

ADD_UVERBS_METHODS(xiw_qp_methods, UVERBS_OBJECT_QP,
		   &UVERBS_METHOD(XIW_METHOD_QP_EVENT),
		   &UVERBS_METHOD(XIW_METHOD_QP_STREAM));

ADD_UVERBS_METHODS(xiw_srq_methods, UVERBS_OBJECT_SRQ,
		   &UVERBS_METHOD(XIW_METHOD_SRQ_EVENT));

const struct uapi_definition xiw_uapi_defs[] = {
	UAPI_DEF_CHAIN(xiw_cm_uapi_defs),
	UAPI_DEF_CHAIN(xiw_ring_uapi_defs),
	UAPI_DEF_CHAIN(xiw_place_uapi_defs),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_CQ, &xiw_cq_methods),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_QP, &xiw_qp_methods),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_SRQ, &xiw_srq_methods),
	{},
};
