//! The receive side of a byte connection: one reusable buffer, every complete message handed
//! up as one batch.

use std::io;
use std::sync::Arc;

use super::budget::{Held, ReceiveBudget, Refused};
use super::stream::ReadHalf;
use crate::metrics::stats::Counters;
use crate::pool::{self, buffer::PoolBuf};
use crate::proto::{Decoder, Limits, Message, ProtocolError, decode_frame};

/// How much room to offer each read. Large enough that a busy connection drains its socket in
/// a few reads; released (to the buffer pool) whenever the connection goes idle with nothing
/// buffered.
const READ_CHUNK: usize = 64 * 1024;

/// A read goes into the current buffer while it has this much room left.
const MIN_ROOM: usize = 8 * 1024;

/// Bytes handed up per turn before the reader lets other tasks run (see [`FrameReader::read_batch`]).
const TURN_BYTES: usize = 1 << 20;

/// Why reading stopped.
#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    Protocol(ProtocolError),
    /// The peer closed the stream in the middle of a frame.
    Truncated,
    /// The peer sent part of a frame, then nothing for the read timeout.
    Stalled(std::time::Duration),
    /// No room for a large frame within the server's receive budget.
    OverBudget(Refused),
}

impl ReadError {
    /// A failed read: a transport that checks bytes itself (shared memory validates its ring)
    /// reports a violation as an I/O error carrying the [`ProtocolError`].
    fn from_io(e: io::Error) -> ReadError {
        match e.get_ref().and_then(|inner| inner.downcast_ref::<ProtocolError>()) {
            Some(p) => ReadError::Protocol(p.clone()),
            None => ReadError::Io(e),
        }
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Protocol(e) => write!(f, "{e}"),
            ReadError::Truncated => {
                write!(f, "peer closed the connection in the middle of a frame")
            }
            ReadError::Stalled(t) => write!(f, "peer stalled in the middle of a frame for {t:?}"),
            ReadError::OverBudget(r) => write!(f, "{r}"),
        }
    }
}

/// Reads frames from one connection.
pub struct FrameReader<R> {
    rd: R,
    /// The receive buffer: taken from the buffer pool when bytes arrive, given back when idle.
    buf: PoolBuf,
    decoder: Decoder,
    limits: Limits,
    /// A protocol error met after some messages of the same read were decoded: those are
    /// handed up first, the error on the next call.
    failed: Option<ProtocolError>,
    /// How long a partly received frame may wait for its next bytes (`None`: forever).
    read_timeout: Option<std::time::Duration>,
    /// When the partly received frame in `buf` times out. Kept here, not in a timer of the
    /// read's future, so that a caller that drops the read (a keepalive tick in the same
    /// `select!`) and starts it again does not restart the clock.
    stall_deadline: Option<tokio::time::Instant>,
    /// Messages and bytes handed up since this reader last waited for the socket.
    spent: (usize, usize),
    /// Times this reader waited for the socket and was woken since it last handed up a batch.
    wakeups: u64,
    /// The server's budget for buffers of large frames, if it has one (servers do, clients not).
    budget: Option<Arc<ReceiveBudget>>,
    /// What `buf` holds of the budget, while it is larger than a read chunk.
    held: Option<Held>,
}

impl<R: ReadHalf> FrameReader<R> {
    /// A reader that first expects the peer's preamble.
    pub fn new(rd: R, limits: Limits) -> Self {
        FrameReader {
            rd,
            buf: PoolBuf::default(),
            decoder: Decoder::new(limits),
            limits,
            failed: None,
            read_timeout: None,
            stall_deadline: None,
            spent: (0, 0),
            wakeups: 0,
            budget: None,
            held: None,
        }
    }

    /// Takes the buffer of any frame larger than a read chunk (64 KiB) from `budget` first,
    /// waiting up to the read timeout while it is spent.
    pub fn with_budget(mut self, budget: Option<Arc<ReceiveBudget>>) -> Self {
        self.budget = budget;
        self
    }

    /// Fails reads with [`ReadError::Stalled`] when the peer sent part of a frame (or of the
    /// preamble) and then nothing for `timeout`. A connection idle between frames is not
    /// affected: that is what keepalive pings are for.
    pub fn with_read_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// Whether bytes read are still waiting to be decoded: part of a frame (its rest is on its
    /// way), or whole frames past the last batch's bound.
    pub fn mid_frame(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The features the peer's preamble announced (0 until it arrived).
    pub fn peer_features(&self) -> u8 {
        self.decoder.peer_features()
    }

    /// Waits for the peer's preamble and checks it; frames that came with it stay buffered.
    /// `Ok(false)` if the peer closed the stream before sending a byte.
    pub async fn preamble(&mut self) -> Result<bool, ReadError> {
        while self.decoder.expects_preamble() {
            self.decoder.take_preamble(&mut self.buf).map_err(ReadError::Protocol)?;
            if self.decoder.expects_preamble() && !self.fill().await? {
                return if self.buf.is_empty() { Ok(false) } else { Err(ReadError::Truncated) };
            }
        }
        Ok(true)
    }

    /// Waits until at least one message is available, then appends every complete message in
    /// the buffer (whole frames, stopping once `max` messages or about 1 MiB are reached) to
    /// `out`.
    ///
    /// Fairness: a peer that keeps its socket full would otherwise never make this wait, and
    /// its connection would hold the runtime's thread while other connections starve (on a
    /// current-thread runtime, all of them). So once `max` messages or 1 MiB were handed up
    /// without waiting for the socket, the next call first yields to the other tasks.
    ///
    /// `Ok(false)` means the peer closed the stream cleanly between frames.
    pub async fn read_batch(
        &mut self,
        out: &mut Vec<Message>,
        max: usize,
        counters: &Counters,
    ) -> Result<bool, ReadError> {
        if self.spent.0 >= max || self.spent.1 >= TURN_BYTES {
            self.spent = (0, 0);
            tokio::task::yield_now().await;
        }
        loop {
            if let Some(e) = self.failed.take() {
                return Err(ReadError::Protocol(e));
            }
            let before = out.len();
            let (mut frames, mut bytes) = (0u64, 0u64);
            while out.len() < max && (bytes as usize) < TURN_BYTES {
                let decoded = self.decoder.next_frame(&mut self.buf).and_then(|frame| match frame {
                    Some(body) => decode_frame(&body, &self.limits, out).map(|()| Some(body.len())),
                    None => Ok(None),
                });
                match decoded {
                    Ok(Some(len)) => {
                        frames += 1;
                        bytes += len as u64 + 4;
                    }
                    Ok(None) => break,
                    // Hand up what came before the bad frame; report the error next time.
                    Err(e) if out.len() > before => {
                        self.failed = Some(e);
                        break;
                    }
                    Err(e) => return Err(ReadError::Protocol(e)),
                }
            }
            if out.len() > before {
                if self.held.is_some() && self.buf.capacity() <= READ_CHUNK {
                    // The large frame was handed up: what it holds is its handler's now.
                    self.held = None;
                }
                counters.received(frames, (out.len() - before) as u64, bytes, self.wakeups);
                self.wakeups = 0;
                self.spent.0 += out.len() - before;
                self.spent.1 += bytes as usize;
                return Ok(true);
            }
            if !self.fill().await? {
                return if self.buf.is_empty() { Ok(false) } else { Err(ReadError::Truncated) };
            }
        }
    }

    /// Reads more bytes. Tries the socket first; only when it has nothing, and the buffer
    /// holds no partial frame, is the buffer released before waiting — so a connection that
    /// goes idle keeps no receive buffer at all. `Ok(false)` at end of stream.
    async fn fill(&mut self) -> Result<bool, ReadError> {
        loop {
            if self.buf.capacity() == 0 {
                // Idle: hold no buffer until the socket has bytes for us.
                self.wait_readable().await?;
            }
            self.make_room(self.decoder.missing(&self.buf)).await?;
            match self.rd.try_read_buf(self.buf.as_bytes_mut()) {
                Ok(0) => return Ok(false),
                Ok(_) => {
                    // Progress: a partial frame gets the whole timeout again from here.
                    self.stall_deadline = None;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.buf.is_empty() {
                        // Idle: the buffer goes back, and the loop's top waits for bytes.
                        pool::buffer::put(std::mem::take(&mut self.buf));
                        self.held = None;
                    } else if let Some(t) = self.read_timeout {
                        // Part of a frame is here: the rest must follow within the timeout.
                        let deadline =
                            *self.stall_deadline.get_or_insert_with(|| tokio::time::Instant::now() + t);
                        match tokio::time::timeout_at(deadline, self.wait_readable()).await {
                            Ok(r) => r?,
                            Err(_) => return Err(ReadError::Stalled(t)),
                        }
                    } else {
                        self.wait_readable().await?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::from_io(e)),
            }
        }
    }

    /// Waits for the socket; a wait that parks the task starts a fresh turn budget and counts
    /// as a wake-up.
    async fn wait_readable(&mut self) -> Result<(), ReadError> {
        let rd = &self.rd;
        let mut readable = std::pin::pin!(rd.readable());
        let mut parked = false;
        let r = std::future::poll_fn(|cx| {
            let p = readable.as_mut().poll(cx);
            parked |= p.is_pending();
            p
        })
        .await;
        if parked {
            self.spent = (0, 0);
            self.wakeups += 1;
        }
        r.map_err(ReadError::from_io)
    }

    /// Makes room for the `missing` bytes of a partial frame, and at least [`MIN_ROOM`]. A
    /// buffer without that room is swapped for one from the buffer pool (a partial frame is
    /// copied over) and given back: it may still be shared with frames handed up, and the pool
    /// reuses it once they are gone — where `reserve` would allocate a new one from the system
    /// whenever it is shared. A buffer larger than a read chunk is taken from the budget first.
    async fn make_room(&mut self, missing: usize) -> Result<(), ReadError> {
        if self.buf.capacity() - self.buf.len() >= missing.max(MIN_ROOM) {
            return Ok(());
        }
        let want = self.buf.len() + missing.max(READ_CHUNK);
        let held = match &self.budget {
            Some(budget) if want > READ_CHUNK => {
                let size = pool::buffer::class_of(want).map_or(want, pool::buffer::class_size);
                Some(budget.take(size, self.read_timeout).await.map_err(ReadError::OverBudget)?)
            }
            _ => None,
        };
        let mut fresh = pool::buffer::get(want);
        fresh.extend_from_slice(&self.buf);
        pool::buffer::put(std::mem::replace(&mut self.buf, fresh));
        // The old buffer's share (if any) goes back with it.
        self.held = held;
        Ok(())
    }

    /// Reads and discards whatever the peer still sends, until it closes, `limit` passes or
    /// 1 MiB was discarded. Used after sending a go-away: closing a TCP socket with unread
    /// bytes makes the kernel send a reset, which can destroy the go-away before the peer
    /// reads it.
    pub async fn drain(&mut self, limit: std::time::Duration) {
        let mut discarded = 0usize;
        let _ = tokio::time::timeout(limit, async {
            while discarded < 1 << 20 {
                self.buf.clear();
                self.buf.reserve(READ_CHUNK);
                match self.rd.try_read_buf(self.buf.as_bytes_mut()) {
                    Ok(0) => return,
                    Ok(n) => discarded += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if self.rd.readable().await.is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        })
        .await;
        self.buf = PoolBuf::default();
        self.held = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A read half holding some bytes and then nothing, ever.
    struct Silent(parking_lot::Mutex<Vec<u8>>);

    impl ReadHalf for Silent {
        async fn readable(&self) -> io::Result<()> {
            if self.0.lock().is_empty() {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
        fn try_read_buf(&mut self, buf: &mut bytes::BytesMut) -> io::Result<usize> {
            let mut held = self.0.lock();
            if held.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            buf.extend_from_slice(&held);
            Ok(std::mem::take(&mut *held).len())
        }
    }

    /// The read timeout of a partial frame counts from its last byte, however often the read is
    /// dropped and started again (a keepalive tick in the connection's `select!` does that).
    #[tokio::test(start_paused = true)]
    async fn dropping_the_read_does_not_restart_the_stall_timer() {
        let mut bytes = crate::proto::PREAMBLE.to_vec();
        bytes.extend_from_slice(&100u32.to_le_bytes());
        bytes.extend_from_slice(&[1; 10]); // 10 of 100 bytes
        let t = Duration::from_secs(10);
        let mut reader = FrameReader::new(Silent(parking_lot::Mutex::new(bytes)), Limits::default())
            .with_read_timeout(Some(t));
        let (counters, mut out) = (Counters::default(), Vec::new());
        let start = tokio::time::Instant::now();
        for _ in 0..10 {
            // A tick every 3 s drops the read.
            match tokio::time::timeout(Duration::from_secs(3), reader.read_batch(&mut out, 100, &counters))
                .await
            {
                Err(_) => continue,
                Ok(Err(ReadError::Stalled(_))) => {
                    assert_eq!(start.elapsed(), t, "the stall is reported at the read timeout");
                    return;
                }
                Ok(other) => panic!("{other:?}"),
            }
        }
        panic!("no stall reported in 30 s with a read timeout of {t:?}");
    }
}
