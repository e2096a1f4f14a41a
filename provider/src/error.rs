//! The provider's error: what went wrong, and the errno a verb returns for
//! it. Functions inside the provider return [`Error`]; the verbs edge
//! (`verbs/`, `dv.rs`) hands [`Error::errno`] to C, and its `Display` is the
//! message the log and `xiwdv_last_error` show.

use std::borrow::Cow;
use std::io;

/// Why, in words: a fixed reason, or one made up when the error is.
pub type Why = Cow<'static, str>;

/// What went wrong inside the provider.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An argument, attribute or work request the call does not take, or an
    /// object whose state does not allow it: `EINVAL`.
    #[error("{0}")]
    Invalid(Why),
    /// Something xiw does not do, or not as it is configured: `EOPNOTSUPP`.
    #[error("{0}")]
    Unsupported(Why),
    /// The object is still in use (memory windows bound to a region): `EBUSY`.
    #[error("{0}")]
    Busy(Why),
    /// Memory that is not mapped with the protection needed: `EFAULT`.
    #[error("{0}")]
    NotMapped(Why),
    /// Memory for a queue cannot be had: `ENOMEM`.
    #[error("{0}")]
    NoMemory(Why),
    /// The kernel refused `what` (a command on the device's command fd, a
    /// system call) with `errno`, which the verb returns.
    #[error("the kernel refused {what}: errno {errno}")]
    Kernel { what: &'static str, errno: i32 },
    /// The kernel module answered with something the provider cannot use:
    /// `EPROTO`.
    #[error("{0}")]
    Protocol(&'static str),
    /// The device's description cannot be read or makes no sense (the sysfs
    /// tree, `xiw_config`, the network interface it is bound to): `ENODEV`.
    #[error("{0}")]
    Device(String),
    /// The peer a QP is to connect to cannot be found or reached, or the
    /// connection cannot be set up: `EINVAL` (what `modify_qp` to RTR returns).
    #[error("{0}")]
    Connect(String),
    /// What backs registered memory cannot be found, or cannot make it
    /// durable as asked: `EINVAL`.
    #[error("{0}")]
    Media(String),
    /// The libibverbs in this process is not a release the provider serves
    /// (registration stops there, so no verb returns it): `EOPNOTSUPP`.
    #[error("{0}")]
    Library(String),
}

impl Error {
    /// The errno the verbs return for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Invalid(_) | Error::Connect(_) | Error::Media(_) => libc::EINVAL,
            Error::Unsupported(_) | Error::Library(_) => libc::EOPNOTSUPP,
            Error::Busy(_) => libc::EBUSY,
            Error::NotMapped(_) => libc::EFAULT,
            Error::NoMemory(_) => libc::ENOMEM,
            Error::Kernel { errno, .. } => *errno,
            Error::Protocol(_) => libc::EPROTO,
            Error::Device(_) => libc::ENODEV,
        }
    }

    pub fn invalid(why: impl Into<Why>) -> Error {
        Error::Invalid(why.into())
    }

    pub fn unsupported(why: impl Into<Why>) -> Error {
        Error::Unsupported(why.into())
    }

    /// A queue's ring that cannot be made: the kernel's errno for it (the
    /// module's memory, the mapping), `ENOMEM` if it has none.
    pub fn ring(e: &io::Error) -> Error {
        match e.raw_os_error() {
            Some(errno) => Error::Kernel {
                what: "the queue's ring",
                errno,
            },
            None => Error::NoMemory("the queue's ring cannot be had".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_and_messages() {
        let cases = [
            (Error::invalid("bad"), libc::EINVAL, "bad"),
            (Error::unsupported("no"), libc::EOPNOTSUPP, "no"),
            (Error::Busy("in use".into()), libc::EBUSY, "in use"),
            (Error::NotMapped("hole".into()), libc::EFAULT, "hole"),
            (Error::NoMemory("full".into()), libc::ENOMEM, "full"),
            (Error::Protocol("odd"), libc::EPROTO, "odd"),
            (Error::Device("gone".into()), libc::ENODEV, "gone"),
            (Error::Connect("far".into()), libc::EINVAL, "far"),
            (Error::Media("ram".into()), libc::EINVAL, "ram"),
            (Error::Library("old".into()), libc::EOPNOTSUPP, "old"),
            (
                Error::Kernel {
                    what: "the region",
                    errno: libc::ENOSPC,
                },
                libc::ENOSPC,
                "the kernel refused the region: errno 28",
            ),
        ];
        for (e, errno, text) in cases {
            assert_eq!(e.errno(), errno, "{e:?}");
            assert_eq!(e.to_string(), text);
        }
        let ring = Error::ring(&io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(ring.errno(), libc::ENOSPC);
        let ring = Error::ring(&io::Error::other("no errno"));
        assert_eq!(ring.errno(), libc::ENOMEM);
    }
}
