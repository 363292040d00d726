//! A file changed or truncated underneath the store is an error naming the slot, never wrong
//! data handed back as right.

mod file_store_common;

use file_store_common::{config, open, read_one, write_one, AlignedBuf, PATHS};
use std::io::{Seek, SeekFrom, Write};
use tiermem_mechanism::file_store::FileStoreError;

const SLOT: usize = 64 << 10;

#[test]
fn checksum_detects_bytes_changed_in_the_file() {
    for io in PATHS {
        let cfg = config("corrupt", 8, SLOT, io);
        let path = cfg.path.clone();
        let Some(store) = open(cfg) else { continue };
        let slots = store.alloc(8).unwrap();
        let bufs: Vec<_> = (0..8).map(|i| AlignedBuf::random(SLOT, 40 + i)).collect();
        for (s, b) in slots.iter().zip(&bufs) {
            write_one(&store, *s, b).unwrap();
        }
        // Flip one byte of slot 3 with an ordinary buffered write.
        let offset = 3 * SLOT as u64 + 1234;
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&[bufs[3].as_slice()[1234] ^ 0x40]).unwrap();
        f.sync_all().unwrap();
        drop(f);

        let mut dst = AlignedBuf::new(SLOT);
        let err = read_one(&store, slots[3], &mut dst).unwrap_err();
        match &err {
            FileStoreError::Checksum { slot: 3, offset, stored, read } => {
                assert_eq!(*offset, 3 * SLOT as u64);
                assert_ne!(stored, read);
            }
            other => panic!("expected a checksum mismatch on slot 3, got: {other}"),
        }
        let msg = err.to_string();
        assert!(msg.starts_with("checksum mismatch on slot 3 (offset 196608): stored 0x"), "{msg}");
        assert!(msg.ends_with("(the file was changed underneath)"), "{msg}");
        // In a batch, the error names the bad slot, and the good slots still read fine alone.
        let mut many: Vec<_> = (0..8).map(|_| AlignedBuf::new(SLOT)).collect();
        let items: Vec<_> = slots.iter().zip(&mut many).map(|(&s, b)| (s, b.mut_ptr())).collect();
        // SAFETY: aligned, distinct, SLOT-sized buffers alive through the call.
        let err = unsafe { store.read(&items) }.unwrap_err();
        assert!(matches!(err, FileStoreError::Checksum { slot: 3, .. }), "{err}");
        read_one(&store, slots[4], &mut dst).unwrap();
        assert!(dst.as_slice() == bufs[4].as_slice());
        // Rewriting the slot heals it.
        write_one(&store, slots[3], &bufs[3]).unwrap();
        read_one(&store, slots[3], &mut dst).unwrap();
        assert!(dst.as_slice() == bufs[3].as_slice());
    }
}

#[test]
fn truncated_file_gives_a_short_read() {
    for io in PATHS {
        let cfg = config("truncate", 8, SLOT, io);
        let path = cfg.path.clone();
        let Some(store) = open(cfg) else { continue };
        let slots = store.alloc(8).unwrap();
        let src = AlignedBuf::random(SLOT, 8);
        for &s in &slots {
            write_one(&store, s, &src).unwrap();
        }
        // Cut the file 4096 bytes into slot 5.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(5 * SLOT as u64 + 4096).unwrap();
        drop(f);

        let mut dst = AlignedBuf::new(SLOT);
        let err = read_one(&store, slots[5], &mut dst).unwrap_err();
        assert_eq!(err, FileStoreError::ShortRead { slot: 5, offset: 5 * SLOT as u64, done: 4096, len: SLOT });
        assert_eq!(err.to_string(), "short read on slot 5 (offset 327680): 4096 of 65536 bytes (file truncated?)");
        let err = read_one(&store, slots[6], &mut dst).unwrap_err();
        assert!(matches!(err, FileStoreError::ShortRead { slot: 6, done: 0, .. }), "{err}");
        // Cut at an offset O_DIRECT cannot resume from: still a short read, not EINVAL.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(4 * SLOT as u64 + 100).unwrap();
        drop(f);
        let err = read_one(&store, slots[4], &mut dst).unwrap_err();
        assert!(matches!(err, FileStoreError::ShortRead { slot: 4, done: 100, .. }), "{err}");
        // Slots before the cut are intact.
        read_one(&store, slots[3], &mut dst).unwrap();
        assert!(dst.as_slice() == src.as_slice());
    }
}
