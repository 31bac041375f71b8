//! tc ingress: counts received packets when XDP cannot be used on the
//! interface (another XDP program owns it, or `--xdp-mode off`).

use aya_ebpf::{macros::classifier, programs::TcContext};
use observer_common::Direction;

use crate::tc_skb::{TC_PASS, observe};

/// Entry point; always returns the pass verdict.
#[classifier]
pub fn observer_tc_in(ctx: TcContext) -> i32 {
    observe(&ctx, Direction::Rx);
    TC_PASS
}
