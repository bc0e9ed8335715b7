//! Client frames the tests build often.

use herald_shared::ids::MsgId;
use herald_shared::protocol::{AckFrame, ClientFrame, SendFrame};

/// A `send` frame with a JSON body.
pub fn send_frame(cmid: &str, conv: &str, body: &serde_json::Value) -> ClientFrame {
    let body = serde_json::value::to_raw_value(body).expect("a JSON value serializes");
    ClientFrame::Send(SendFrame { cmid: cmid.into(), conv: conv.into(), body })
}

/// An `ack` frame of these ids.
pub fn ack_frame(ids: impl IntoIterator<Item = MsgId>) -> ClientFrame {
    ClientFrame::Ack(AckFrame { ids: ids.into_iter().collect() })
}
