//! The NVMe suite: tiermem paging a GPU buffer to a file and back, against the disk's own
//! O_DIRECT speed and the Bakita paper's two baselines — direct I/O (read into pinned
//! memory, then copy to the GPU) and demand paging (`mmap`, touch every 4 KiB page, copy).

use super::{median, today};
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tiermem::mechanism::pattern;
use tiermem::mechanism::{BackendKind, Device, StreamPriority};
use tiermem::{Access, AllocOptions, Engine, EngineConfig, Region, Target};

/// Bytes per request of the raw and direct-I/O measurements.
const REQUEST: usize = 8 << 20;

/// A page-aligned heap buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("a valid layout");
        // SAFETY: the layout has a non-zero size; the result is checked below.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for a {len}-byte buffer");
        Self { ptr, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `layout.size()` initialised bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

fn open_direct(path: &Path, write: bool) -> Result<File, String> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .create(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("bench nvme: open {} with O_DIRECT: {e}", path.display()))
}

/// Seconds to read (or write) `size` bytes of `path` with `threads` threads of O_DIRECT
/// requests in flight, each taking every `threads`-th request.
fn raw_pass(path: &Path, size: usize, threads: usize, write: bool) -> Result<f64, String> {
    let file = open_direct(path, write)?;
    let t = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|k| {
                let file = &file;
                s.spawn(move || -> std::io::Result<()> {
                    let mut buf = Aligned::new(REQUEST);
                    for offset in (k * REQUEST..size).step_by(threads * REQUEST) {
                        if write {
                            file.write_all_at(buf.bytes(), offset as u64)?;
                        } else {
                            file.read_exact_at(buf.bytes(), offset as u64)?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().expect("an I/O thread panicked"))
    })
    .map_err(|e| format!("bench nvme: O_DIRECT {} of {}: {e}", if write { "write" } else { "read" }, path.display()))?;
    Ok(t.elapsed().as_secs_f64())
}

/// The disk's best sequential O_DIRECT GB/s over queue depths 1–32: (GB/s, depth).
fn disk_ceiling(path: &Path, size: usize, reps: usize, write: bool) -> Result<(f64, usize), String> {
    let mut best = (0.0, 0);
    for depth in [1, 4, 16, 32] {
        let samples: Vec<f64> = (0..reps).map(|_| raw_pass(path, size, depth, write)).collect::<Result<_, _>>()?;
        let gbps = size as f64 / 1e9 / median(samples);
        if gbps > best.0 {
            best = (gbps, depth);
        }
    }
    Ok(best)
}

/// The paper's direct-I/O baseline, one thread: read the file into pinned memory with
/// O_DIRECT, then copy it to the GPU (or the reverse), sequentially. Seconds.
fn direct_io(device: &Arc<dyn Device>, path: &Path, size: usize, up: bool) -> Result<f64, String> {
    let d = device.as_ref();
    let err = |e: tiermem::mechanism::DeviceError| format!("bench nvme: {e}");
    let host = d.alloc_pinned(size).map_err(err)?;
    let dev = d.alloc_plain(size).map_err(err)?;
    let stream = d.create_stream(StreamPriority::High).map_err(err)?;
    let file = open_direct(path, !up)?;
    // SAFETY: `host` is pinned memory of `size` bytes owned here until freed below; the copy
    // is synchronised before the slice is used for I/O or freed.
    let pinned = unsafe { std::slice::from_raw_parts_mut(host as *mut u8, size) };
    let t = Instant::now();
    let io = |pinned: &mut [u8]| -> std::io::Result<()> {
        for (k, piece) in pinned.chunks_mut(REQUEST).enumerate() {
            let offset = (k * REQUEST) as u64;
            if up {
                file.read_exact_at(piece, offset)?
            } else {
                file.write_all_at(piece, offset)?
            }
        }
        Ok(())
    };
    let copy = || -> Result<(), String> {
        // SAFETY: see `pinned`.
        let r = unsafe {
            if up {
                d.copy_to_device_async(dev, host, size, stream)
            } else {
                d.copy_to_host_async(host, dev, size, stream)
            }
        };
        r.and_then(|()| d.synchronize_stream(stream)).map_err(err)
    };
    if up {
        io(pinned).map_err(|e| format!("bench nvme: direct I/O read: {e}"))?;
        copy()?;
    } else {
        copy()?;
        io(pinned).map_err(|e| format!("bench nvme: direct I/O write: {e}"))?;
    }
    let seconds = t.elapsed().as_secs_f64();
    d.destroy_stream(stream).map_err(err)?;
    d.free_plain(dev).map_err(err)?;
    d.free_pinned(host, size).map_err(err)?;
    Ok(seconds)
}

/// The paper's demand-paging baseline: `mmap` the file, touch every 4 KiB page (each a page
/// fault reading from disk), then copy the mapping to the GPU. Seconds.
fn demand_paging(device: &Arc<dyn Device>, path: &Path, size: usize) -> Result<f64, String> {
    let d = device.as_ref();
    let err = |e: tiermem::mechanism::DeviceError| format!("bench nvme: {e}");
    let file = File::open(path).map_err(|e| format!("bench nvme: open {}: {e}", path.display()))?;
    // SAFETY: plain syscall on an open descriptor; drops whatever of the file is cached.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let dev = d.alloc_plain(size).map_err(err)?;
    let t = Instant::now();
    // SAFETY: a private read-only mapping of `size` bytes of a file at least that long.
    let map =
        unsafe { libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
    if map == libc::MAP_FAILED {
        return Err(format!("bench nvme: mmap {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    // SAFETY: the mapping is `size` readable bytes until the munmap below.
    let bytes = unsafe { std::slice::from_raw_parts(map as *const u8, size) };
    let touched = bytes.iter().step_by(4096).fold(0u8, |acc, &b| acc ^ b);
    std::hint::black_box(touched);
    d.write(dev, bytes).map_err(err)?;
    let seconds = t.elapsed().as_secs_f64();
    // SAFETY: unmaps exactly the mapping made above; `bytes` is not used after this.
    unsafe { libc::munmap(map, size) };
    d.free_plain(dev).map_err(err)?;
    Ok(seconds)
}

pub fn run(json_dir: &Path, work_dir: &Path, commit: &str, reps: usize, size: usize) -> Result<(), String> {
    std::fs::create_dir_all(work_dir).map_err(|e| format!("bench nvme: create {}: {e}", work_dir.display()))?;
    let data = work_dir.join("tiermem-bench-data");
    let scratch = work_dir.join("tiermem-bench-scratch");
    let tier_file = work_dir.join("tiermem-bench-tier");
    let size = size.next_multiple_of(REQUEST);

    // The data file: the pattern of seed 1, written with O_DIRECT (so nothing of it is cached).
    {
        let file = open_direct(&data, true)?;
        let mut buf = Aligned::new(REQUEST);
        for offset in (0..size).step_by(REQUEST) {
            pattern::fill(1, offset, buf.bytes());
            file.write_all_at(buf.bytes(), offset as u64)
                .map_err(|e| format!("bench nvme: write {}: {e}", data.display()))?;
        }
    }
    let base = EngineConfig::from_env().map_err(|e| e.to_string())?;
    let config = EngineConfig {
        hbm_limit: Some(2 * size),
        peers: tiermem::PeerChoice::Off,
        host_limit: Some(size),
        file: Some(tier_file.clone()),
        file_limit: 2 * size,
        sim_hbm: 3 * size,
        ..base
    };
    let file_io = format!("{:?}, queue depth {}", config.file_io, config.file_queue_depth);
    let engine = Engine::new(config).map_err(|e| format!("bench nvme: {e}"))?;
    let info = engine.device_info().clone();
    if info.backend == BackendKind::Sim {
        println!("WARNING: simulated device: these numbers are not GPU measurements and must not be committed.");
    }
    let device = Arc::clone(engine.device());
    println!(
        "device: {}, driver {}; files in {}; {} MiB, {reps} reps, medians",
        info.name,
        info.driver_version,
        work_dir.display(),
        size >> 20
    );

    // The disk's speed drifts within a run (a virtual disk), so after the sweep for the best
    // queue depths every measurement is taken once per round, all of them in each round: each
    // median compares numbers taken side by side.
    let (_, read_depth) = disk_ceiling(&data, size, reps, false)?;
    let (_, write_depth) = disk_ceiling(&scratch, size, reps, true)?;
    let fail = |e: tiermem::Error| format!("bench nvme: {e}");
    let stream = device.create_stream(StreamPriority::High).map_err(|e| e.to_string())?;
    let (a, _) = engine.alloc(size, AllocOptions { name: Some("A".into()), ..Default::default() }).map_err(fail)?;
    let mut bytes = vec![0u8; size];
    pattern::fill(a.0, 0, &mut bytes);
    engine.write(a, 0, &bytes).map_err(fail)?;
    let whole = [Region::whole(a)];
    let mut samples: [Vec<f64>; 10] = Default::default();
    let [disk_reads, disk_writes, direct_ins, direct_outs, demands, outs, ins, clean, first, starts] = &mut samples;
    for round in 0..reps + 1 {
        let warm_up = round == 0;
        let keep = |into: &mut Vec<f64>, seconds: f64| {
            if !warm_up {
                into.push(seconds);
            }
        };
        keep(disk_reads, raw_pass(&data, size, read_depth, false)?);
        keep(disk_writes, raw_pass(&scratch, size, write_depth, true)?);
        keep(direct_ins, direct_io(&device, &data, size, true)?);
        keep(direct_outs, direct_io(&device, &scratch, size, false)?);
        keep(demands, demand_paging(&device, &data, size)?);
        // Dirty, as after a kernel that wrote it: the page-out must write the file.
        engine.acquire(&whole, Access::ReadWrite, stream).map_err(fail)?;
        engine.release(&whole, stream).map_err(fail)?;
        let t = Instant::now();
        engine.page_out_to_file(Target::Buffer(a)).map_err(fail)?;
        keep(outs, t.elapsed().as_secs_f64());
        let t = Instant::now();
        engine.acquire(&[Region::bytes(a, 0, 1)], Access::ReadOnly, stream).map_err(fail)?;
        device.synchronize_stream(stream).map_err(|e| e.to_string())?;
        keep(first, t.elapsed().as_secs_f64());
        engine.release(&[Region::bytes(a, 0, 1)], stream).map_err(fail)?;
        engine.page_out_to_file(Target::Buffer(a)).map_err(fail)?;
        // Asynchronous: the caller is free once `page_in_start` returns (the paper's overhead).
        let t = Instant::now();
        let ticket = engine.page_in_start(Target::Buffer(a)).map_err(fail)?;
        keep(starts, t.elapsed().as_secs_f64());
        engine.finish(ticket).map_err(fail)?;
        keep(ins, t.elapsed().as_secs_f64());
        // Unchanged since it came from the file: leaving again writes nothing.
        let t = Instant::now();
        engine.page_out_to_file(Target::Buffer(a)).map_err(fail)?;
        keep(clean, t.elapsed().as_secs_f64());
        engine.page_in(Target::Buffer(a)).map_err(fail)?;
    }
    let gb = size as f64 / 1e9;
    let rate = |v: &Vec<f64>| gb / median(v.clone());
    let (disk_read, disk_write) = (rate(disk_reads), rate(disk_writes));
    println!("disk O_DIRECT: read {disk_read:.2} GB/s (queue depth {read_depth}), write {disk_write:.2} GB/s (queue depth {write_depth})");
    let (directio_in, directio_out, demand_in) = (rate(direct_ins), rate(direct_outs), rate(demands));
    println!("direct I/O: in {directio_in:.2} GB/s, out {directio_out:.2} GB/s; demand paging in {demand_in:.2} GB/s");
    let (page_out, page_in) = (rate(outs), rate(ins));
    let ms = |v: &Vec<f64>| median(v.clone()) * 1e3;
    let (clean_ms, first_ms, start_ms) = (ms(clean), ms(first), ms(starts));
    let demand_ms = gb / demand_in * 1e3;
    println!("tiermem ({file_io}): page-in {page_in:.2} GB/s, page-out {page_out:.2} GB/s, clean page-out {clean_ms:.2} ms, first usable byte after {first_ms:.2} ms");
    println!("page_in_start returns after {start_ms:.2} ms (demand paging holds the caller {demand_ms:.0} ms)");
    let mut back = vec![0u8; size];
    engine.read(a, 0, &mut back).map_err(fail)?;
    let verified = back == bytes;
    println!("verified: {verified}");
    let stats = format!("{}", engine.stats());
    device.destroy_stream(stream).map_err(|e| e.to_string())?;
    drop(engine);
    for path in [&data, &scratch] {
        let _ = std::fs::remove_file(path);
    }

    let date = today();
    let report = super::report(
        "nvme",
        commit,
        &date,
        &info,
        json!({
            "disk_read_GBps": disk_read,
            "disk_write_GBps": disk_write,
            "directio_in_GBps": directio_in,
            "directio_out_GBps": directio_out,
            "demand_in_GBps": demand_in,
            "page_in_GBps": page_in,
            "page_out_GBps": page_out,
            "clean_page_out_ms": clean_ms,
            "first_byte_ms": first_ms,
            "page_in_start_ms": start_ms,
        }),
        json!({
            "in_vs_disk": page_in / disk_read,
            "in_vs_directio": page_in / directio_in,
            "in_vs_demand": page_in / demand_in,
            "out_vs_disk": page_out / disk_write,
            "start_overhead_vs_demand": start_ms / demand_ms,
        }),
        verified,
    );
    let detail = json!({
        "suite": "nvme-detail",
        "commit": commit,
        "date": date,
        "backend": info.backend.to_string(),
        "bytes": size,
        "reps": reps,
        "disk_read_queue_depth": read_depth,
        "disk_write_queue_depth": write_depth,
        "request_bytes": REQUEST,
        "file_tier_io": file_io,
        "engine_stats": stats,
        "targets": { "in_vs_disk": 0.9, "in_vs_directio": 1.2, "in_vs_demand": 3.0, "out_vs_disk": 0.9 },
    });
    super::write_report(json_dir, "nvme", &date, commit, &report, &detail)?;
    if verified {
        Ok(())
    } else {
        Err("bench nvme: verification failed".into())
    }
}
