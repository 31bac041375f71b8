//! tc egress: counts packets the node sends, GSO skbs by their segments.

use aya_ebpf::{macros::classifier, programs::TcContext};
use observer_common::Direction;

use crate::tc_skb::{TC_PASS, observe};

/// Entry point; always returns the pass verdict.
#[classifier]
pub fn observer_tc_out(ctx: TcContext) -> i32 {
    observe(&ctx, Direction::Tx);
    TC_PASS
}
