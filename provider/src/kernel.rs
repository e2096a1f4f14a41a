//! Kernel mode: the kernel's side of a device the xiw module registered,
//! reached through the context's command fd (which libibverbs opened on the
//! device's uverbs node and owns). The kernel keeps an object for each PD,
//! CQ, SRQ and QP, as the RDMA core needs them (`rdma resource`, the
//! connection manager finding a QP by number); a CQ's carries its completion
//! channel, which the module's own method signals when the provider
//! completes work on an armed CQ. The data path stays in the provider.

use std::os::fd::RawFd;

use xiw_abi::kernel::*;
use xiw_abi::limits::DRIVER_ID;

use crate::error::Error;
use crate::sys;

/// The kernel objects a QP is made of, by their kernel handles, and its sizes.
#[derive(Clone, Copy)]
pub struct QpObjects {
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
    pub caps: xiw_abi::verbs::ibv_qp_cap,
    pub sq_sig_all: bool,
}

/// The command fd of a context on a kernel-registered device.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    fd: RawFd,
}

impl Kernel {
    pub fn new(cmd_fd: RawFd) -> Kernel {
        Kernel { fd: cmd_fd }
    }

    /// A protection domain; its handle.
    pub fn alloc_pd(&self) -> Result<u32, Error> {
        let mut resp = PdHandle::default();
        let cmd = AllocPd {
            response: &mut resp as *mut PdHandle as u64,
        };
        self.write(CMD_ALLOC_PD, "ALLOC_PD", &cmd, size_of_val(&resp))?;
        Ok(resp.pd_handle)
    }

    pub fn dealloc_pd(&self, handle: u32) -> Result<(), Error> {
        self.write(
            CMD_DEALLOC_PD,
            "DEALLOC_PD",
            &PdHandle { pd_handle: handle },
            0,
        )
    }

    /// The kernel's object for QP `qpn` (the provider's number, which the
    /// module takes), reported to events as `user_handle`; its handle, and
    /// its slot in the events page if it has one.
    pub fn create_qp(
        &self,
        user_handle: u64,
        qp: QpObjects,
        qpn: u32,
    ) -> Result<(u32, Option<u32>), Error> {
        /// The core's response, then xiw's.
        #[repr(C)]
        #[derive(Default)]
        struct Resp {
            core: CreateQpResp,
            drv: CreateQpDrvResp,
        }
        let mut full = Resp {
            drv: CreateQpDrvResp {
                events_slot: u32::MAX,
                reserved: 0,
            },
            ..Default::default()
        };
        let cmd = CreateQp {
            response: &mut full as *mut Resp as u64,
            user_handle,
            pd_handle: qp.pd,
            send_cq_handle: qp.send_cq,
            recv_cq_handle: qp.recv_cq,
            srq_handle: qp.srq.unwrap_or(0),
            max_send_wr: qp.caps.max_send_wr,
            max_recv_wr: qp.caps.max_recv_wr,
            max_send_sge: qp.caps.max_send_sge,
            max_recv_sge: qp.caps.max_recv_sge,
            max_inline_data: qp.caps.max_inline_data,
            sq_sig_all: u8::from(qp.sq_sig_all),
            qp_type: QPT_RC,
            is_srq: u8::from(qp.srq.is_some()),
            reserved: 0,
            req: CreateQpReq { qpn, reserved: 0 },
        };
        self.write(CMD_CREATE_QP, "CREATE_QP", &cmd, size_of_val(&full))?;
        let resp = full.core;
        if resp.qpn != qpn {
            // The module took another number: the QP is not usable as named.
            let _ = self.destroy(CMD_DESTROY_QP, "DESTROY_QP", resp.qp_handle);
            return Err(Error::Protocol(
                "the module gave the QP another number than the provider's",
            ));
        }
        let slot = full.drv.events_slot;
        Ok((
            resp.qp_handle,
            (slot < xiw_abi::events::SLOTS).then_some(slot),
        ))
    }

    /// Tells the kernel's QP the state the provider's moved to.
    pub fn modify_qp_state(&self, handle: u32, state: u32) -> Result<(), Error> {
        let cmd = ModifyQp {
            dests: [0; 64],
            qp_handle: handle,
            attr_mask: QP_STATE,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: 0,
            pkey_index: 0,
            alt_pkey_index: 0,
            qp_state: state as u8,
            rest: [0; 15],
        };
        self.write(CMD_MODIFY_QP, "MODIFY_QP", &cmd, 0)
    }

    /// Destroys the kernel's QP `handle`; how many async events the kernel
    /// reported for it (the application acknowledges as many first).
    pub fn destroy_qp(&self, handle: u32) -> Result<u32, Error> {
        self.destroy(CMD_DESTROY_QP, "DESTROY_QP", handle)
    }

    /// A shared receive queue of PD `pd`; its handle.
    pub fn create_srq(
        &self,
        user_handle: u64,
        pd: u32,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<u32, Error> {
        let mut resp = CreateSrqResp::default();
        let cmd = CreateSrq {
            response: &mut resp as *mut CreateSrqResp as u64,
            user_handle,
            pd_handle: pd,
            max_wr,
            max_sge,
            srq_limit: 0,
        };
        self.write(CMD_CREATE_SRQ, "CREATE_SRQ", &cmd, size_of_val(&resp))?;
        Ok(resp.srq_handle)
    }

    /// The kernel's object for a region of PD `pd`, `[start, start + len)`
    /// with the rights the kernel knows of `access`; its handle. `req`
    /// names its STag (the object's keys), its TO base and whether the
    /// module pins it to place RDMA Writes into it from the socket
    /// ([`REG_MR_PLACE`]); every other access the provider checks itself.
    pub fn reg_mr(
        &self,
        pd: u32,
        start: u64,
        len: u64,
        access: u32,
        req: RegMrReq,
    ) -> Result<u32, Error> {
        use xiw_abi::verbs::*;
        let known = IBV_ACCESS_LOCAL_WRITE
            | IBV_ACCESS_REMOTE_WRITE
            | IBV_ACCESS_REMOTE_READ
            | IBV_ACCESS_REMOTE_ATOMIC
            | IBV_ACCESS_MW_BIND;
        let mut resp = RegMrResp::default();
        let cmd = RegMr {
            response: &mut resp as *mut RegMrResp as u64,
            start,
            length: len,
            // The provider's own iova need not keep the page offset the
            // kernel insists on; the kernel's object takes the address.
            hca_va: start,
            pd_handle: pd,
            access_flags: access & known,
            req,
        };
        self.write(CMD_REG_MR, "REG_MR", &cmd, size_of_val(&resp))?;
        Ok(resp.mr_handle)
    }

    pub fn dereg_mr(&self, handle: u32) -> Result<(), Error> {
        self.write_destroy(CMD_DEREG_MR, "DEREG_MR", &DeregMr { mr_handle: handle }, 0)
    }

    /// As [`Kernel::destroy_qp`], for an SRQ.
    pub fn destroy_srq(&self, handle: u32) -> Result<u32, Error> {
        self.destroy(CMD_DESTROY_SRQ, "DESTROY_SRQ", handle)
    }

    fn destroy(&self, command: u32, what: &'static str, handle: u32) -> Result<u32, Error> {
        let mut resp = DestroyObjResp::default();
        let cmd = DestroyObj {
            response: &mut resp as *mut DestroyObjResp as u64,
            handle,
            reserved: 0,
        };
        self.write_destroy(command, what, &cmd, size_of_val(&resp))?;
        Ok(resp.events_reported)
    }

    /// A destroy command. The kernel refuses one (EBUSY) while a method of
    /// the module holds the object (an event or a notification the
    /// provider's progress thread is raising on it): that ends at once, so
    /// the destroy is tried again.
    fn write_destroy<C: Copy>(
        &self,
        command: u32,
        what: &'static str,
        cmd: &C,
        resp_len: usize,
    ) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            match self.write(command, what, cmd, resp_len) {
                Err(e) if e.errno() == libc::EBUSY && tries < 10_000 => {
                    tries += 1;
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    /// The kernel's object for a CQ whose completion events report
    /// `user_handle` (its `ibv_cq`), tied to the completion channel `channel`
    /// (an fd) if any; its handle.
    pub fn create_cq(
        &self,
        user_handle: u64,
        cqe: u32,
        channel: Option<RawFd>,
        vector: u32,
    ) -> Result<u32, Error> {
        let mut resp = CreateCqResp::default();
        let cmd = CreateCq {
            response: &mut resp as *mut CreateCqResp as u64,
            user_handle,
            cqe,
            comp_vector: vector,
            comp_channel: channel.unwrap_or(-1),
            reserved: 0,
        };
        self.write(CMD_CREATE_CQ, "CREATE_CQ", &cmd, size_of_val(&resp))?;
        Ok(resp.cq_handle)
    }

    /// Destroys the kernel's CQ `handle`; how many completion events and
    /// async events the kernel reported for it (the application acknowledges
    /// as many before the CQ may go).
    pub fn destroy_cq(&self, handle: u32) -> Result<(u32, u32), Error> {
        let mut resp = DestroyCqResp::default();
        let cmd = DestroyCq {
            response: &mut resp as *mut DestroyCqResp as u64,
            cq_handle: handle,
            reserved: 0,
        };
        self.write_destroy(CMD_DESTROY_CQ, "DESTROY_CQ", &cmd, size_of_val(&resp))?;
        Ok((resp.comp_events_reported, resp.async_events_reported))
    }

    /// Asks the module to signal the completion channel of CQ `handle`.
    pub fn cq_notify(&self, handle: u32) -> Result<(), Error> {
        self.method(
            OBJECT_CQ,
            METHOD_CQ_NOTIFY,
            "CQ_NOTIFY",
            &[mandatory(ATTR_CQ_NOTIFY_HANDLE, 0, handle.into())],
        )
    }

    /// Names the ring of CQ `handle` (mapped at `offset`): the module may
    /// take its arm word and signal the completion channel itself.
    pub fn cq_ring(&self, handle: u32, offset: u64) -> Result<(), Error> {
        self.method(
            OBJECT_CQ,
            METHOD_CQ_RING,
            "CQ_RING",
            &[
                mandatory(ATTR_CQ_RING_HANDLE, 0, handle.into()),
                mandatory(ATTR_CQ_RING_OFFSET, 8, offset),
            ],
        )
    }

    /// The stream of QP `handle`, which the provider connected itself
    /// (socket `fd`; `crc`: MPA CRC agreed), is the module's to watch from
    /// now on, as a stream rdma_cm handed over.
    pub fn qp_stream(&self, handle: u32, fd: i32, crc: bool) -> Result<(), Error> {
        self.qp_stream_attr(handle, fd as u32, crc)
    }

    /// The module lets go of the stream of QP `handle` that
    /// [`Kernel::qp_stream`] gave it.
    pub fn qp_unshare(&self, handle: u32) -> Result<(), Error> {
        self.qp_stream_attr(handle, QP_STREAM_NONE, false)
    }

    fn qp_stream_attr(&self, handle: u32, fd: u32, crc: bool) -> Result<(), Error> {
        self.method(
            OBJECT_QP,
            METHOD_QP_STREAM,
            "QP_STREAM",
            &[
                mandatory(ATTR_QP_STREAM_HANDLE, 0, handle.into()),
                mandatory(ATTR_QP_STREAM_FD, 8, fd.into()),
                mandatory(
                    ATTR_QP_STREAM_FLAGS,
                    8,
                    if crc { QP_STREAM_CRC.into() } else { 0 },
                ),
            ],
        )
    }

    /// The STag of the region whose kernel object is `handle` was
    /// invalidated: the module places nothing more into it (it returns once
    /// a placement under way is over).
    pub fn mr_invalidate(&self, handle: u32) -> Result<(), Error> {
        self.method(
            OBJECT_MR,
            METHOD_MR_INVALIDATE,
            "MR_INVALIDATE",
            &[mandatory(ATTR_MR_INVALIDATE_HANDLE, 0, handle.into())],
        )
    }

    /// The next connection rdma_cm set up for one of this context's QPs; its
    /// socket is a descriptor of this process now. EAGAIN if none waits.
    pub fn take_stream(&self) -> Result<Stream, Error> {
        let mut out = Stream::default();
        self.method(
            OBJECT_DEVICE,
            METHOD_TAKE_STREAM,
            "TAKE_STREAM",
            &[mandatory(
                ATTR_TAKE_STREAM_RESP,
                size_of::<Stream>() as u16,
                &mut out as *mut Stream as u64,
            )],
        )?;
        Ok(out)
    }

    /// Memory of the module's for a ring of `len` bytes: where it is mapped
    /// from the command fd.
    pub fn ring_alloc(&self, len: u64) -> Result<u64, Error> {
        let mut offset = 0u64;
        self.method(
            OBJECT_DEVICE,
            METHOD_RING_ALLOC,
            "RING_ALLOC",
            &[
                mandatory(ATTR_RING_LEN, 8, len),
                mandatory(ATTR_RING_OFFSET, 8, &mut offset as *mut u64 as u64),
            ],
        )?;
        Ok(offset)
    }

    /// Gives back the ring at `offset` (its memory goes with the last mapping).
    pub fn ring_free(&self, offset: u64) -> Result<(), Error> {
        self.method(
            OBJECT_DEVICE,
            METHOD_RING_FREE,
            "RING_FREE",
            &[mandatory(ATTR_RING_OFFSET, 8, offset)],
        )
    }

    /// The command fd, which the module's memory is mapped from.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Raises `event` (an `ibv_event_type`) on the kernel's `object`, so it
    /// reaches the application's async event fd.
    pub fn raise_event(&self, object: EventObject, handle: u32, event: u32) -> Result<(), Error> {
        let (obj, method, what) = match object {
            EventObject::Qp => (OBJECT_QP, METHOD_QP_EVENT, "QP_EVENT"),
            EventObject::Cq => (OBJECT_CQ, METHOD_CQ_EVENT, "CQ_EVENT"),
            EventObject::Srq => (OBJECT_SRQ, METHOD_SRQ_EVENT, "SRQ_EVENT"),
        };
        self.method(
            obj,
            method,
            what,
            &[
                mandatory(ATTR_EVENT_HANDLE, 0, handle.into()),
                mandatory(ATTR_EVENT_TYPE, 8, event.into()),
            ],
        )
    }

    /// One of the module's methods (`what`, for the error), with up to two
    /// attributes.
    fn method(
        &self,
        object: u16,
        method: u16,
        what: &'static str,
        attrs: &[IoctlAttr],
    ) -> Result<(), Error> {
        const MAX: usize = 4;
        #[repr(C)]
        struct Call {
            hdr: IoctlHdr,
            attrs: [IoctlAttr; MAX],
        }
        debug_assert!(attrs.len() <= MAX);
        let n = attrs.len().min(MAX);
        let mut call = Call {
            hdr: IoctlHdr {
                length: (size_of::<IoctlHdr>() + n * size_of::<IoctlAttr>()) as u16,
                object_id: object,
                method_id: method,
                num_attrs: n as u16,
                driver_id: DRIVER_ID,
                ..Default::default()
            },
            attrs: [IoctlAttr::default(); MAX],
        };
        call.attrs[..n].copy_from_slice(&attrs[..n]);
        const IOCTL: rustix::ioctl::Opcode = RDMA_VERBS_IOCTL as rustix::ioctl::Opcode;
        // SAFETY: the command fd (open while the context lives) takes
        // RDMA_VERBS_IOCTL with a header and the attributes it announces, all
        // in `call`; the buffers the attributes name outlive the call.
        unsafe { sys::ioctl_update::<IOCTL, Call>(self.fd, &mut call) }
            .map_err(|e| refused(what, &e))
    }

    /// A legacy `write()` command (`what`, for the error): the header, then
    /// `cmd` (whose `response` points at `resp_len` bytes the kernel fills).
    fn write<C: Copy>(
        &self,
        command: u32,
        what: &'static str,
        cmd: &C,
        resp_len: usize,
    ) -> Result<(), Error> {
        #[repr(C)]
        struct Buf<C> {
            hdr: CmdHdr,
            cmd: C,
        }
        let buf = Buf {
            hdr: CmdHdr {
                command,
                in_words: (size_of::<Buf<C>>() / 4) as u16,
                out_words: (resp_len / 4) as u16,
            },
            cmd: *cmd,
        };
        let len = size_of::<Buf<C>>();
        // SAFETY: writing `len` bytes of `buf`; the kernel writes the
        // response to the buffer the command points at, which outlives the call.
        match unsafe { sys::write_raw(self.fd, &buf as *const Buf<C> as *const u8, len) } {
            Ok(n) if n == len => Ok(()),
            // Part of a command is no command.
            Ok(_) => Err(Error::Kernel {
                what,
                errno: libc::EIO,
            }),
            Err(e) => Err(refused(what, &e)),
        }
    }
}

/// The kinds of object the provider raises async events on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventObject {
    Qp,
    Cq,
    Srq,
}

/// A mandatory attribute: an object handle (`len` 0), a value held in
/// place or a buffer's address (`len` its size).
fn mandatory(attr_id: u16, len: u16, data: u64) -> IoctlAttr {
    IoctlAttr {
        attr_id,
        len,
        flags: ATTR_F_MANDATORY,
        attr_data: 0,
        data,
    }
}

/// The kernel refused `what` with `e` (EIO if it has no errno).
fn refused(what: &'static str, e: &std::io::Error) -> Error {
    Error::Kernel {
        what,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}
