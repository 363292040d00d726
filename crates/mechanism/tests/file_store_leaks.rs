//! Dropping a store gives everything back: no descriptor (file, io_uring rings), no thread,
//! no file on disk. One test in this binary, so no other test opens descriptors meanwhile.

mod file_store_common;

use file_store_common::{config, open, read_one, write_one, AlignedBuf, PATHS};

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn drop_releases_descriptors_threads_and_the_file() {
    for io in PATHS {
        let (fds, tasks) = (count("/proc/self/fd"), count("/proc/self/task"));
        let cfg = config("leaks", 8, 64 << 10, io);
        let path = cfg.path.clone();
        let Some(store) = open(cfg) else { continue };
        let slots = store.alloc(8).unwrap();
        let src = AlignedBuf::random(64 << 10, 1);
        let mut dst = AlignedBuf::new(64 << 10);
        // Concurrent callers make the io_uring path create extra rings.
        std::thread::scope(|s| {
            for &slot in &slots {
                let (store, src) = (&store, &src);
                s.spawn(move || write_one(store, slot, src).unwrap());
            }
        });
        read_one(&store, slots[7], &mut dst).unwrap();
        assert!(dst.as_slice() == src.as_slice());
        assert!(count("/proc/self/fd") > fds);
        drop(store);
        assert_eq!(count("/proc/self/fd"), fds, "{io:?}: descriptors left open");
        // io_uring's kernel workers (io-wq) are threads of this process that exit shortly
        // after their ring closes, not during the close: give them a moment.
        for _ in 0..100 {
            if count("/proc/self/task") == tasks {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(count("/proc/self/task"), tasks, "{io:?}: threads left running");
        assert!(!path.exists(), "{io:?}: file left behind");
    }
}
