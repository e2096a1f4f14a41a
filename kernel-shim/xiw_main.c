// SPDX-License-Identifier: GPL-2.0
/*
 * xiw: module set-up, `rdma link add ... type xiw` and the netdev a device
 * is bound to.
 */

#include <linux/module.h>
#include <linux/netdevice.h>
#include <linux/etherdevice.h>
#include <linux/inetdevice.h>
#include <rdma/ib_verbs.h>
#include <rdma/iw_cm.h>
#include <rdma/rdma_netlink.h>

#include "xiw.h"

MODULE_AUTHOR("xiw developers");
MODULE_DESCRIPTION("xiw software iWARP device (kernel side)");
MODULE_LICENSE("GPL");
/* The package version (Cargo.toml), which DKMS names the module by. */
MODULE_VERSION("0.1.0");
MODULE_ALIAS_RDMA_LINK("xiw");

/* An EUI-64 from the netdev's hardware address, or a made-up one. */
static __be64 xiw_node_guid(struct net_device *ndev)
{
	u8 g[8];

	if (ndev->addr_len == ETH_ALEN && !is_zero_ether_addr(ndev->dev_addr)) {
		g[0] = ndev->dev_addr[0] ^ 2;
		g[1] = ndev->dev_addr[1];
		g[2] = ndev->dev_addr[2];
		g[3] = 0xff;
		g[4] = 0xfe;
		g[5] = ndev->dev_addr[3];
		g[6] = ndev->dev_addr[4];
		g[7] = ndev->dev_addr[5];
	} else {
		g[0] = 'x';
		g[1] = 'i';
		g[2] = 'w';
		g[3] = 0;
		put_unaligned_be32(ndev->ifindex, &g[4]);
	}
	return cpu_to_be64(get_unaligned_be64(g));
}

static int xiw_newlink(const char *ibdev_name, struct net_device *ndev)
{
	struct ib_device *found;
	struct xiw_device *xdev;
	struct ib_device *ibdev;
	int rv;

	found = ib_device_get_by_netdev(ndev, XIW_DRIVER_ID);
	if (found) {
		ib_device_put(found);
		return -EEXIST;
	}
	if (ndev->type != ARPHRD_ETHER && ndev->type != ARPHRD_NONE &&
	    ndev->type != ARPHRD_LOOPBACK)
		return -EINVAL;

	xdev = ib_alloc_device(xiw_device, ibdev);
	if (!xdev)
		return -ENOMEM;
	ibdev = &xdev->ibdev;
	xdev->ndev = ndev;
	xa_init_flags(&xdev->qps, XA_FLAGS_LOCK_IRQ);

	ib_set_device_ops(ibdev, &xiw_device_ops);
	ibdev->node_type = RDMA_NODE_RNIC;
	ibdev->phys_port_cnt = 1;
	ibdev->num_comp_vectors = 1;
	ibdev->node_guid = xiw_node_guid(ndev);
	strscpy(ibdev->node_desc, "xiw", sizeof(ibdev->node_desc));
	memcpy(ibdev->iw_ifname, ndev->name, sizeof(ibdev->iw_ifname));
	ibdev->iw_driver_flags = IW_F_NO_PORT_MAP;
	ibdev->driver_def = xiw_uapi_defs;

	rv = ib_device_set_netdev(ibdev, ndev, 1);
	if (rv)
		goto err;
	rv = ib_register_device(ibdev, ibdev_name, NULL);
	if (rv)
		goto err;
	return 0;
err:
	ib_dealloc_device(ibdev);
	return rv;
}

static struct rdma_link_ops xiw_link_ops = {
	.type = "xiw",
	.newlink = xiw_newlink,
};

/* Port events for the device bound to a netdev; removal with the netdev. */
static int xiw_netdev_event(struct notifier_block *nb, unsigned long event,
			    void *arg)
{
	struct net_device *ndev = netdev_notifier_info_to_dev(arg);
	struct ib_device *ibdev;
	struct ib_event ev = {};

	ibdev = ib_device_get_by_netdev(ndev, XIW_DRIVER_ID);
	if (!ibdev)
		return NOTIFY_DONE;

	ev.device = ibdev;
	ev.element.port_num = 1;
	switch (event) {
	case NETDEV_UP:
	case NETDEV_CHANGE:
		ev.event = netif_running(ndev) && netif_carrier_ok(ndev) ?
			IB_EVENT_PORT_ACTIVE : IB_EVENT_PORT_ERR;
		ib_dispatch_event(&ev);
		break;
	case NETDEV_DOWN:
		ev.event = IB_EVENT_PORT_ERR;
		ib_dispatch_event(&ev);
		break;
	case NETDEV_CHANGEADDR:
		ev.event = IB_EVENT_GID_CHANGE;
		ib_dispatch_event(&ev);
		break;
	case NETDEV_UNREGISTER:
		ib_unregister_device_queued(ibdev);
		break;
	default:
		break;
	}
	ib_device_put(ibdev);
	return NOTIFY_OK;
}

static struct notifier_block xiw_netdev_nb = {
	.notifier_call = xiw_netdev_event,
};

/* An IPv4 address came or went: GID 0 follows the netdev's first one. */
static int xiw_inetaddr_event(struct notifier_block *nb, unsigned long event,
			      void *arg)
{
	struct in_ifaddr *ifa = arg;
	struct ib_device *ibdev;
	struct ib_event ev = {};

	if (!ifa->ifa_dev)
		return NOTIFY_DONE;
	ibdev = ib_device_get_by_netdev(ifa->ifa_dev->dev, XIW_DRIVER_ID);
	if (!ibdev)
		return NOTIFY_DONE;
	ev.device = ibdev;
	ev.element.port_num = 1;
	ev.event = IB_EVENT_GID_CHANGE;
	ib_dispatch_event(&ev);
	ib_device_put(ibdev);
	return NOTIFY_OK;
}

static struct notifier_block xiw_inetaddr_nb = {
	.notifier_call = xiw_inetaddr_event,
};

static int __init xiw_init(void)
{
	int rv;

	rv = xiw_cm_init();
	if (rv)
		return rv;
	rv = register_netdevice_notifier(&xiw_netdev_nb);
	if (rv)
		goto err_cm;
	rv = register_inetaddr_notifier(&xiw_inetaddr_nb);
	if (rv) {
		unregister_netdevice_notifier(&xiw_netdev_nb);
		goto err_cm;
	}
	rdma_link_register(&xiw_link_ops);
	return 0;
err_cm:
	xiw_cm_exit();
	return rv;
}

static void __exit xiw_exit(void)
{
	rdma_link_unregister(&xiw_link_ops);
	unregister_inetaddr_notifier(&xiw_inetaddr_nb);
	unregister_netdevice_notifier(&xiw_netdev_nb);
	ib_unregister_driver(XIW_DRIVER_ID);
	xiw_cm_exit();
}

module_init(xiw_init);
module_exit(xiw_exit);
