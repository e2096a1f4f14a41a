//! Keeps include/xiw_abi.h in step with src/ring.rs: compiles a C program that
//! prints every size, offset and constant of the header, and compares them with
//! the Rust definitions.

use std::mem::{offset_of, size_of};
use std::process::Command;

use xiw_abi::ring::*;
use xiw_abi::{events, kernel, limits};

macro_rules! fields {
    ($($cty:literal, $cfield:literal, $rust:expr;)*) => {
        vec![$((format!("offsetof({}, {})", $cty, $cfield), $rust as u64)),*]
    };
}

#[test]
fn c_header_matches_rust_layout() {
    let mut checks: Vec<(String, u64)> = fields! {
        "struct xiw_ring_header", "magic", offset_of!(RingHeader, magic);
        "struct xiw_ring_header", "version", offset_of!(RingHeader, version);
        "struct xiw_ring_header", "kind", offset_of!(RingHeader, kind);
        "struct xiw_ring_header", "entries", offset_of!(RingHeader, entries);
        "struct xiw_ring_header", "stride", offset_of!(RingHeader, stride);
        "struct xiw_ring_header", "owner_id", offset_of!(RingHeader, owner_id);
        "struct xiw_ring_header", "producer", offset_of!(RingHeader, producer);
        "struct xiw_ring_header", "consumer", offset_of!(RingHeader, consumer);
        "struct xiw_ring_header", "flags", offset_of!(RingHeader, flags);
        "struct xiw_ring_header", "arm", offset_of!(RingHeader, arm);
        "struct xiw_ring_header", "arm_seq", offset_of!(RingHeader, arm_seq);
        "struct xiw_ring_header", "doorbell", offset_of!(RingHeader, doorbell);
        "struct xiw_sge", "addr", offset_of!(Sge, addr);
        "struct xiw_sge", "length", offset_of!(Sge, length);
        "struct xiw_sge", "lkey", offset_of!(Sge, lkey);
        "struct xiw_send_wqe", "wr_id", offset_of!(SendWqe, wr_id);
        "struct xiw_send_wqe", "opcode", offset_of!(SendWqe, opcode);
        "struct xiw_send_wqe", "flags", offset_of!(SendWqe, flags);
        "struct xiw_send_wqe", "num_sge", offset_of!(SendWqe, num_sge);
        "struct xiw_send_wqe", "op_flags", offset_of!(SendWqe, op_flags);
        "struct xiw_send_wqe", "imm_or_inv", offset_of!(SendWqe, imm_or_inv);
        "struct xiw_send_wqe", "remote_addr", offset_of!(SendWqe, remote_addr);
        "struct xiw_send_wqe", "rkey", offset_of!(SendWqe, rkey);
        "struct xiw_send_wqe", "length", offset_of!(SendWqe, length);
        "struct xiw_send_wqe", "operand0", offset_of!(SendWqe, operand0);
        "struct xiw_send_wqe", "operand1", offset_of!(SendWqe, operand1);
        "struct xiw_send_wqe", "mask0", offset_of!(SendWqe, mask0);
        "struct xiw_send_wqe", "mask1", offset_of!(SendWqe, mask1);
        "struct xiw_recv_wqe", "wr_id", offset_of!(RecvWqe, wr_id);
        "struct xiw_recv_wqe", "num_sge", offset_of!(RecvWqe, num_sge);
        "struct xiw_recv_wqe", "length", offset_of!(RecvWqe, length);
        "struct xiw_cqe", "wr_id", offset_of!(Cqe, wr_id);
        "struct xiw_cqe", "byte_len", offset_of!(Cqe, byte_len);
        "struct xiw_cqe", "imm_or_inv", offset_of!(Cqe, imm_or_inv);
        "struct xiw_cqe", "qp_num", offset_of!(Cqe, qp_num);
        "struct xiw_cqe", "vendor_err", offset_of!(Cqe, vendor_err);
        "struct xiw_cqe", "opcode", offset_of!(Cqe, opcode);
        "struct xiw_cqe", "status", offset_of!(Cqe, status);
        "struct xiw_cqe", "wc_flags", offset_of!(Cqe, wc_flags);
        "struct xiw_events_header", "magic", offset_of!(events::EventsHeader, magic);
        "struct xiw_events_header", "slots", offset_of!(events::EventsHeader, slots);
        "struct xiw_events_header", "cm", offset_of!(events::EventsHeader, cm);
        "struct xiw_events_header", "armed", offset_of!(events::EventsHeader, armed);
        "struct xiw_events_header", "pending", offset_of!(events::EventsHeader, pending);
        "struct xiw_events_slot", "events", offset_of!(events::EventsSlot, events);
        "struct xiw_events_slot", "hint", offset_of!(events::EventsSlot, hint);
        "struct xiw_events_slot", "place", offset_of!(events::EventsSlot, place);
        "struct xiw_events_slot", "flags", offset_of!(events::EventsSlot, flags);
        "struct xiw_events_slot", "write_len", offset_of!(events::EventsSlot, write_len);
        "struct xiw_events_slot", "after_write", offset_of!(events::EventsSlot, after_write);
        "struct xiw_events_slot", "hand_len", offset_of!(events::EventsSlot, hand_len);
        "struct xiw_events_slot", "hand", offset_of!(events::EventsSlot, hand);
        "struct xiw_events_slot", "read_stag", offset_of!(events::EventsSlot, read_stag);
        "struct xiw_events_slot", "read_to", offset_of!(events::EventsSlot, read_to);
        "struct xiw_events_slot", "read_left", offset_of!(events::EventsSlot, read_left);
        "struct xiw_alloc_ucontext_resp", "events_offset", offset_of!(kernel::AllocUcontextResp, events_offset);
        "struct xiw_alloc_ucontext_resp", "events_len", offset_of!(kernel::AllocUcontextResp, events_len);
        "struct xiw_create_qp_resp", "events_slot", offset_of!(kernel::CreateQpDrvResp, events_slot);
    };
    for (c, n) in [
        ("struct xiw_ring_header", size_of::<RingHeader>()),
        ("struct xiw_sge", size_of::<Sge>()),
        ("struct xiw_send_wqe", size_of::<SendWqe>()),
        ("struct xiw_recv_wqe", size_of::<RecvWqe>()),
        ("struct xiw_cqe", size_of::<Cqe>()),
        (
            "struct xiw_create_qp_req",
            size_of::<xiw_abi::kernel::CreateQpReq>(),
        ),
        ("struct xiw_stream", size_of::<xiw_abi::kernel::Stream>()),
        (
            "struct xiw_alloc_ucontext_req",
            size_of::<xiw_abi::kernel::AllocUcontextReq>(),
        ),
        (
            "struct xiw_events_header",
            size_of::<events::EventsHeader>(),
        ),
        ("struct xiw_events_slot", size_of::<events::EventsSlot>()),
        (
            "struct xiw_alloc_ucontext_resp",
            size_of::<kernel::AllocUcontextResp>(),
        ),
        (
            "struct xiw_create_qp_resp",
            size_of::<kernel::CreateQpDrvResp>(),
        ),
        ("struct xiw_reg_mr_req", size_of::<kernel::RegMrReq>()),
    ] {
        checks.push((format!("sizeof({c})"), n as u64));
    }
    let consts: &[(&str, u64)] = &[
        ("XIW_KERNEL_DRIVER_ID", limits::DRIVER_ID as u64),
        ("XIW_UVERBS_ABI_VERSION", limits::UVERBS_ABI_VERSION as u64),
        ("XIW_VENDOR_ID", limits::VENDOR_ID as u64),
        ("XIW_VENDOR_PART_ID", limits::VENDOR_PART_ID as u64),
        ("XIW_MAX_QP", limits::MAX_QP as u64),
        ("XIW_EVENTS_MAGIC", events::EVENTS_MAGIC as u64),
        ("XIW_EVENTS_VERSION", events::EVENTS_VERSION as u64),
        ("XIW_EVENTS_SLOTS", events::SLOTS as u64),
        ("XIW_EVENTS_SUMMARY_OFFSET", events::SUMMARY_OFFSET as u64),
        ("XIW_EVENTS_SLOTS_OFFSET", events::SLOTS_OFFSET as u64),
        ("XIW_EVENTS_BYTES", events::EVENTS_BYTES as u64),
        ("XIW_EVENTS_SLOT_BYTES", events::SLOT_BYTES as u64),
        ("XIW_PLACE_USER", events::PLACE_USER as u64),
        ("XIW_PLACE_KERNEL", events::PLACE_KERNEL as u64),
        ("XIW_PLACE_HANDED", events::PLACE_HANDED as u64),
        ("XIW_PLACE_F_READ", events::PLACE_F_READ as u64),
        ("XIW_HAND_BYTES", events::HAND_BYTES as u64),
        ("XIW_HAND_LEN_MASK", events::HAND_LEN_MASK as u64),
        ("XIW_HAND_MORE", events::HAND_MORE as u64),
        ("XIW_HAND_DONE", events::HAND_DONE as u64),
        (
            "XIW_PLACE_F_AFTER_WRITE",
            events::PLACE_F_AFTER_WRITE as u64,
        ),
        ("XIW_REG_MR_PLACE", kernel::REG_MR_PLACE as u64),
        (
            "XIW_METHOD_MR_INVALIDATE",
            kernel::METHOD_MR_INVALIDATE as u64,
        ),
        (
            "XIW_ATTR_MR_INVALIDATE_HANDLE",
            kernel::ATTR_MR_INVALIDATE_HANDLE as u64,
        ),
        ("XIW_EV_DATA", events::EV_DATA as u64),
        ("XIW_EV_WRITABLE", events::EV_WRITABLE as u64),
        ("XIW_EV_CLOSED", events::EV_CLOSED as u64),
        ("XIW_EV_SIGNALLED_SHIFT", events::EV_SIGNALLED_SHIFT as u64),
        ("XIW_EV_SIGNALLED_ONE", events::EV_SIGNALLED_ONE as u64),
        ("XIW_EV_MARKS", events::EV_MARKS as u64),
        ("XIW_EV_HINT_PROGRESS", events::HINT_PROGRESS as u64),
        ("XIW_EV_HINT_APP", events::HINT_APP as u64),
        ("XIW_MAX_QP_WR", limits::MAX_QP_WR as u64),
        ("XIW_MAX_SGE", limits::MAX_SGE as u64),
        ("XIW_MAX_INLINE", limits::MAX_INLINE as u64),
        ("XIW_MAX_CQE", limits::MAX_CQE as u64),
        ("XIW_MAX_MR", limits::MAX_MR as u64),
        ("XIW_MAX_SRQ", limits::MAX_SRQ as u64),
        ("XIW_MAX_PD", limits::MAX_PD as u64),
        ("XIW_MAX_MSG_SZ", limits::MAX_MSG_SZ as u64),
        ("XIW_MAX_RD_ATOMIC", limits::MAX_RD_ATOMIC as u64),
        ("XIW_UVERBS_DRIVER_NS", kernel::DRIVER_NS as u64),
        ("XIW_METHOD_CQ_NOTIFY", kernel::METHOD_CQ_NOTIFY as u64),
        (
            "XIW_ATTR_CQ_NOTIFY_HANDLE",
            kernel::ATTR_CQ_NOTIFY_HANDLE as u64,
        ),
        ("XIW_CQE_F_SOLICITED", CQE_F_SOLICITED as u64),
        ("XIW_METHOD_QP_EVENT", kernel::METHOD_QP_EVENT as u64),
        ("XIW_METHOD_CQ_EVENT", kernel::METHOD_CQ_EVENT as u64),
        ("XIW_METHOD_CQ_RING", kernel::METHOD_CQ_RING as u64),
        (
            "XIW_ATTR_CQ_RING_HANDLE",
            kernel::ATTR_CQ_RING_HANDLE as u64,
        ),
        (
            "XIW_ATTR_CQ_RING_OFFSET",
            kernel::ATTR_CQ_RING_OFFSET as u64,
        ),
        ("XIW_METHOD_QP_STREAM", kernel::METHOD_QP_STREAM as u64),
        (
            "XIW_ATTR_QP_STREAM_HANDLE",
            kernel::ATTR_QP_STREAM_HANDLE as u64,
        ),
        ("XIW_ATTR_QP_STREAM_FD", kernel::ATTR_QP_STREAM_FD as u64),
        (
            "XIW_ATTR_QP_STREAM_FLAGS",
            kernel::ATTR_QP_STREAM_FLAGS as u64,
        ),
        ("XIW_QP_STREAM_CRC", kernel::QP_STREAM_CRC as u64),
        ("XIW_QP_STREAM_NONE", kernel::QP_STREAM_NONE as u64),
        ("XIW_METHOD_SRQ_EVENT", kernel::METHOD_SRQ_EVENT as u64),
        ("XIW_ATTR_EVENT_HANDLE", kernel::ATTR_EVENT_HANDLE as u64),
        ("XIW_ATTR_EVENT_TYPE", kernel::ATTR_EVENT_TYPE as u64),
        ("XIW_METHOD_TAKE_STREAM", kernel::METHOD_TAKE_STREAM as u64),
        (
            "XIW_ATTR_TAKE_STREAM_RESP",
            kernel::ATTR_TAKE_STREAM_RESP as u64,
        ),
        ("XIW_METHOD_RING_ALLOC", kernel::METHOD_RING_ALLOC as u64),
        ("XIW_METHOD_RING_FREE", kernel::METHOD_RING_FREE as u64),
        ("XIW_ATTR_RING_LEN", kernel::ATTR_RING_LEN as u64),
        ("XIW_ATTR_RING_OFFSET", kernel::ATTR_RING_OFFSET as u64),
        ("XIW_RING_MAX_BYTES", kernel::RING_MAX_BYTES),
        ("XIW_RINGS_PER_CONTEXT", kernel::RINGS_PER_CONTEXT as u64),
        ("XIW_RTR_NONE", kernel::RTR_NONE as u64),
        ("XIW_RTR_SEND", kernel::RTR_SEND as u64),
        ("XIW_RTR_WRITE", kernel::RTR_WRITE as u64),
        ("XIW_RTR_READ", kernel::RTR_READ as u64),
        ("XIW_RING_MAGIC", RING_MAGIC as u64),
        ("XIW_RING_VERSION", RING_VERSION as u64),
        ("XIW_RING_KIND_SQ", RING_KIND_SQ as u64),
        ("XIW_RING_KIND_RQ", RING_KIND_RQ as u64),
        ("XIW_RING_KIND_SRQ", RING_KIND_SRQ as u64),
        ("XIW_RING_KIND_CQ", RING_KIND_CQ as u64),
        ("XIW_RING_SLOTS_OFFSET", RING_SLOTS_OFFSET as u64),
        ("XIW_RING_F_NEED_DOORBELL", RING_F_NEED_DOORBELL as u64),
        ("XIW_RING_F_ERROR", RING_F_ERROR as u64),
        ("XIW_CQ_ARM_NONE", CQ_ARM_NONE as u64),
        ("XIW_CQ_ARM_NEXT", CQ_ARM_NEXT as u64),
        ("XIW_CQ_ARM_SOLICITED", CQ_ARM_SOLICITED as u64),
        ("XIW_OP_SEND", op::SEND as u64),
        ("XIW_OP_SEND_INV", op::SEND_INV as u64),
        ("XIW_OP_SEND_IMM", op::SEND_IMM as u64),
        ("XIW_OP_WRITE", op::WRITE as u64),
        ("XIW_OP_WRITE_IMM", op::WRITE_IMM as u64),
        ("XIW_OP_READ", op::READ as u64),
        ("XIW_OP_ATOMIC_CMP_SWP", op::ATOMIC_CMP_SWP as u64),
        ("XIW_OP_ATOMIC_FETCH_ADD", op::ATOMIC_FETCH_ADD as u64),
        ("XIW_OP_LOCAL_INV", op::LOCAL_INV as u64),
        ("XIW_OP_ATOMIC_WRITE", op::ATOMIC_WRITE as u64),
        ("XIW_OP_FLUSH", op::FLUSH as u64),
        ("XIW_OP_VERIFY", op::VERIFY as u64),
        (
            "XIW_OP_ATOMIC_MASKED_CMP_SWP",
            op::ATOMIC_MASKED_CMP_SWP as u64,
        ),
        (
            "XIW_OP_ATOMIC_MASKED_FETCH_ADD",
            op::ATOMIC_MASKED_FETCH_ADD as u64,
        ),
        ("XIW_OP_ATOMIC_SWAP", op::ATOMIC_SWAP as u64),
        ("XIW_OP_BIND_MW", op::BIND_MW as u64),
        ("XIW_WQE_SIGNALED", wqe_flag::SIGNALED as u64),
        ("XIW_WQE_SOLICITED", wqe_flag::SOLICITED as u64),
        ("XIW_WQE_FENCE", wqe_flag::FENCE as u64),
        ("XIW_WQE_INLINE", wqe_flag::INLINE as u64),
    ];
    for (name, v) in consts {
        checks.push(((*name).to_string(), *v));
    }

    let dir = std::env::temp_dir().join(format!("xiw-abi-h-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xiw_abi.h\"\nint main(void) {\n",
    );
    for (expr, _) in &checks {
        src.push_str(&format!(
            "  printf(\"%llu\\n\", (unsigned long long)({expr}));\n"
        ));
    }
    src.push_str("  return 0;\n}\n");
    let c = dir.join("check.c");
    std::fs::write(&c, src).unwrap();
    let exe = dir.join("check");
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I", include, "-o"])
        .arg(&exe)
        .arg(&c)
        .status()
        .expect("a C compiler (cc) to build the header check");
    assert!(st.success(), "xiw_abi.h does not compile cleanly");
    let out = Command::new(&exe).output().unwrap();
    let got: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got.len(), checks.len());
    let mut bad = Vec::new();
    for ((expr, want), got) in checks.iter().zip(got) {
        if *want != got {
            bad.push(format!("{expr}: C says {got}, Rust says {want}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        bad.is_empty(),
        "xiw_abi.h and ring.rs disagree:\n{}",
        bad.join("\n")
    );
}
