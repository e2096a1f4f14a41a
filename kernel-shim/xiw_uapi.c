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

DECLARE_UVERBS_NAMED_METHOD(XIW_METHOD_CQ_NOTIFY,
			    UVERBS_ATTR_IDR(XIW_ATTR_CQ_NOTIFY_HANDLE,
					    UVERBS_OBJECT_CQ,
					    UVERBS_ACCESS_READ,
					    UA_MANDATORY));

ADD_UVERBS_METHODS(xiw_cq_methods, UVERBS_OBJECT_CQ,
		   &UVERBS_METHOD(XIW_METHOD_CQ_NOTIFY));

const struct uapi_definition xiw_uapi_defs[] = {
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_CQ, &xiw_cq_methods),
	{},
};
