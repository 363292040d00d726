//! Frames: a 4-byte big-endian length, then that many bytes of one JSON message.
//!
//! The length is checked before anything is buffered: a frame announced larger than
//! [`MAX_FRAME_BYTES`] is an error at once, so a peer cannot make the other side hold more
//! than one maximal frame. Garbage is an error ([`ProtocolError::Malformed`]), never a panic.
//! [`FrameDecoder`] works on bytes from anywhere (tokio in the daemon); [`FrameReader`] reads
//! from a blocking stream with a read timeout (the tenant's thread) without losing a partly
//! read frame when the timeout strikes.

use crate::ProtocolError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{ErrorKind, Read, Write};

/// The largest frame body either side sends or accepts.
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

const HEADER: usize = 4;

/// `message` as one frame.
pub fn encode<M: Serialize>(message: &M) -> Result<Vec<u8>, ProtocolError> {
    let body = serde_json::to_vec(message).map_err(|e| ProtocolError::Malformed(format!("encode: {e}")))?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge { len: body.len(), max: MAX_FRAME_BYTES });
    }
    let mut frame = Vec::with_capacity(HEADER + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes `message` as one frame.
pub fn write_message<M: Serialize>(writer: &mut impl Write, message: &M) -> Result<(), ProtocolError> {
    let frame = encode(message)?;
    writer.write_all(&frame).map_err(ProtocolError::Io)?;
    writer.flush().map_err(ProtocolError::Io)
}

/// Cuts a byte stream into messages.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes received.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes received and not yet decoded (a partial frame).
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    /// The next complete message, if one has arrived. After an error the stream is unusable.
    pub fn next_message<M: DeserializeOwned>(&mut self) -> Result<Option<M>, ProtocolError> {
        let Some(header) = self.buffer.first_chunk::<HEADER>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(ProtocolError::FrameTooLarge { len, max: MAX_FRAME_BYTES });
        }
        if self.buffer.len() < HEADER + len {
            return Ok(None);
        }
        let parsed = serde_json::from_slice(&self.buffer[HEADER..HEADER + len]);
        self.buffer.drain(..HEADER + len);
        parsed.map(Some).map_err(|e| ProtocolError::Malformed(e.to_string()))
    }
}

/// Reads messages from a blocking stream (one with a read timeout, or not).
pub struct FrameReader<R> {
    reader: R,
    decoder: FrameDecoder,
}

impl<R: Read> FrameReader<R> {
    pub fn new(reader: R) -> Self {
        Self { reader, decoder: FrameDecoder::new() }
    }

    pub fn get_ref(&self) -> &R {
        &self.reader
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.reader
    }

    /// The next message; `Ok(None)` when the read timed out first. A closed stream is
    /// [`ProtocolError::Closed`].
    pub fn poll<M: DeserializeOwned>(&mut self) -> Result<Option<M>, ProtocolError> {
        loop {
            if let Some(message) = self.decoder.next_message()? {
                return Ok(Some(message));
            }
            let mut chunk = [0u8; 8192];
            match self.reader.read(&mut chunk) {
                Ok(0) => return Err(ProtocolError::Closed),
                Ok(n) => self.decoder.extend(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(ProtocolError::Io(e)),
            }
        }
    }

    /// The next message, waiting through read timeouts until `deadline`.
    pub fn wait<M: DeserializeOwned>(&mut self, deadline: std::time::Instant) -> Result<M, ProtocolError> {
        loop {
            if let Some(message) = self.poll()? {
                return Ok(message);
            }
            if std::time::Instant::now() >= deadline {
                return Err(ProtocolError::Timeout);
            }
        }
    }
}
