//! Bounds on what a peer may send. Crossing one is a [`ProtocolError`](super::ProtocolError)
//! that closes that connection only.

/// Protocol limits, enforced by the decoder on what it receives and used by
/// senders to cut bundles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[derive(derive_setters::Setters)]
pub struct Limits {
    /// Largest frame body accepted, in bytes (the 4-byte length prefix not counted).
    pub max_frame_len: usize,
    /// Most messages one frame may bundle.
    pub max_messages_per_frame: usize,
    /// Most items one batch request or batch reply may carry.
    pub max_batch_items: usize,
}

impl Limits {
    /// 16 MiB frames: room for a 4 MiB payload several times over, small enough that one
    /// hostile length prefix cannot make us reserve gigabytes.
    pub const DEFAULT_MAX_FRAME_LEN: usize = 16 << 20;
    /// 4096 messages per bundle: four times a full server turn (`max_batch` = 1000).
    pub const DEFAULT_MAX_MESSAGES_PER_FRAME: usize = 4096;
    /// 65,536 items per batch message: 512 default chunks of 128.
    pub const DEFAULT_MAX_BATCH_ITEMS: usize = 65_536;
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_len: Self::DEFAULT_MAX_FRAME_LEN,
            max_messages_per_frame: Self::DEFAULT_MAX_MESSAGES_PER_FRAME,
            max_batch_items: Self::DEFAULT_MAX_BATCH_ITEMS,
        }
    }
}
