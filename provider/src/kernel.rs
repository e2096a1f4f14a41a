//! Kernel mode: the kernel's side of a device the xiw module registered,
//! reached through the context's command fd (which libibverbs opened on the
//! device's uverbs node and owns). The kernel keeps an object for each CQ,
//! which carries its completion channel; the module's own method signals
//! that channel when the provider completes work on an armed CQ.

use std::os::fd::RawFd;

use xiw_abi::kernel::*;
use xiw_abi::limits::DRIVER_ID;

/// The command fd of a context on a kernel-registered device.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    fd: RawFd,
}

impl Kernel {
    pub fn new(cmd_fd: RawFd) -> Kernel {
        Kernel { fd: cmd_fd }
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
    ) -> Result<u32, i32> {
        let mut resp = CreateCqResp::default();
        let cmd = CreateCq {
            response: &mut resp as *mut CreateCqResp as u64,
            user_handle,
            cqe,
            comp_vector: vector,
            comp_channel: channel.unwrap_or(-1),
            reserved: 0,
        };
        self.write(CMD_CREATE_CQ, &cmd, size_of_val(&resp))?;
        Ok(resp.cq_handle)
    }

    /// Destroys the kernel's CQ `handle`; how many completion events the
    /// kernel reported for it (the application acknowledges as many before
    /// the CQ may go).
    pub fn destroy_cq(&self, handle: u32) -> Result<u32, i32> {
        let mut resp = DestroyCqResp::default();
        let cmd = DestroyCq {
            response: &mut resp as *mut DestroyCqResp as u64,
            cq_handle: handle,
            reserved: 0,
        };
        self.write(CMD_DESTROY_CQ, &cmd, size_of_val(&resp))?;
        Ok(resp.comp_events_reported)
    }

    /// Asks the module to signal the completion channel of CQ `handle`.
    pub fn cq_notify(&self, handle: u32) -> Result<(), i32> {
        #[repr(C)]
        struct Call {
            hdr: IoctlHdr,
            attr: IoctlAttr,
        }
        let mut call = Call {
            hdr: IoctlHdr {
                length: size_of::<Call>() as u16,
                object_id: OBJECT_CQ,
                method_id: METHOD_CQ_NOTIFY,
                num_attrs: 1,
                driver_id: DRIVER_ID,
                ..Default::default()
            },
            attr: IoctlAttr {
                attr_id: ATTR_CQ_NOTIFY_HANDLE,
                flags: ATTR_F_MANDATORY,
                data: u64::from(handle),
                ..Default::default()
            },
        };
        // SAFETY: the command fd takes RDMA_VERBS_IOCTL with a header and
        // the attributes it announces, all in `call`.
        let rc = unsafe { libc::ioctl(self.fd, RDMA_VERBS_IOCTL as _, &mut call as *mut Call) };
        if rc == 0 {
            Ok(())
        } else {
            Err(errno())
        }
    }

    /// A legacy `write()` command: the header, then `cmd` (whose `response`
    /// points at `resp_len` bytes the kernel fills).
    fn write<C: Copy>(&self, command: u32, cmd: &C, resp_len: usize) -> Result<(), i32> {
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
        let n = unsafe { libc::write(self.fd, &buf as *const Buf<C> as *const libc::c_void, len) };
        if n == len as isize {
            Ok(())
        } else if n < 0 {
            Err(errno())
        } else {
            Err(libc::EIO)
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
