use tiermem::mechanism;
use tiermem::mechanism::file_store::{FileStore, FileStoreConfig, IoChoice};
use tiermem::{format_size, EngineConfig};

/// `tiermem info`: what this machine offers tiermem.
pub fn run() -> Result<(), String> {
    let config = EngineConfig::from_env().map_err(|e| e.to_string())?;
    let sim = mechanism::SimNode { gpus: config.sim_gpus, hbm_per_gpu: config.sim_hbm };
    let (device, fallback) =
        mechanism::open_in_node(config.backend, config.device, sim).map_err(|e| format!("info: {e}"))?;
    let info = device.info();
    let (free, total) = device.mem_info().map_err(|e| format!("info: {e}"))?;
    println!("backend          {}", info.backend);
    if let Some(why) = fallback {
        println!("                 (no GPU usable: {why}; set TIERMEM_BACKEND=cuda to insist)");
    }
    println!("device           {} (ordinal {} of {})", info.name, info.ordinal, info.device_count);
    println!("driver           {}", info.driver_version);
    println!("CUDA             {}", info.cuda_version);
    println!("memory           {} free of {}", format_size(free), format_size(total));
    println!("VMM API          {}", if info.vmm_supported { "supported" } else { "not supported" });
    println!("granularity      {}", format_size(info.granularity));
    let chunk = mechanism::chunked::chunk_bytes(info.granularity, config.chunk.unwrap_or(0));
    println!("chunk            {} (TIERMEM_CHUNK: each one allocation and one mapping)", format_size(chunk));
    let peers = if info.peers.is_empty() { "none".to_string() } else { format!("{:?}", info.peers) };
    println!("peer access      {peers}");
    match tiermem::peer_lending(device.as_ref(), &config) {
        Ok(lending) => {
            for (gpu, bytes) in &lending.lenders {
                println!(
                    "peer tier        GPU {gpu} lends {} (free memory less TIERMEM_PEER_RESERVE); {}",
                    format_size(*bytes),
                    lender_busy(device.as_ref(), *gpu, config.peer_busy_rate)
                );
            }
            let none = if lending.lenders.is_empty() { "none: " } else { "not from " };
            for note in &lending.notes {
                println!("peer tier        {none}{note}");
            }
            let gpus: Vec<usize> = lending.lenders.iter().map(|&(gpu, _)| gpu).collect();
            let paths = match (gpus.is_empty(), config.multipath) {
                (true, _) => "one link (no GPU lends)".to_string(),
                (false, false) => "one link (TIERMEM_MULTIPATH=off)".to_string(),
                (false, true) => {
                    format!("this GPU's link and those of GPUs {gpus:?} while they lend (TIERMEM_MULTIPATH)")
                }
            };
            println!("host page-ins    {paths}");
        }
        Err(e) => println!("peer tier        none: {e}"),
    }
    println!("memlock limit    {}", memlock_limit());
    if info.backend == tiermem::mechanism::BackendKind::Cuda {
        println!("pinned memory    {}", tiermem::mechanism::cuda::pinned_memory_way());
    }
    let hbm_cap = config.hbm_cap(info.backend, free);
    println!(
        "HBM cap          {} ({})",
        format_size(hbm_cap),
        if config.hbm_limit.is_some() {
            "TIERMEM_HBM_LIMIT"
        } else {
            "default: free memory less a 2 GiB reserve on a GPU"
        }
    );
    println!("policy           {}", config.policy);
    let ahead = |bytes: usize| if bytes == 0 { "off".to_string() } else { format_size(bytes) };
    println!("stride prefetch  {} (TIERMEM_STRIDE_PREFETCH)", ahead(config.stride_prefetch));
    println!("pre-eviction     {} (TIERMEM_PRE_EVICT)", ahead(config.pre_evict));
    println!("file store I/O   {}", file_store_probe(info.granularity));
    match crate::run::preload_library() {
        Ok(path) => println!("tiermem run      {} (TIERMEM_PRELOAD)", path.display()),
        Err(why) => println!("tiermem run      not ready: {why}"),
    }
    for (name, usable, why) in tiermem_swap::system::swap_backends() {
        println!("VRAM swap        {name:<10} {} ({why})", if usable { "usable" } else { "not usable" });
    }
    Ok(())
}

/// Which I/O path and alignment a file store gets in `TIERMEM_FILE_DIR` (default: the
/// temporary directory), found by opening a small one there.
fn file_store_probe(slot_size: usize) -> String {
    let dir = std::env::var_os("TIERMEM_FILE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let path = dir.join(format!("tiermem-probe-{}", std::process::id()));
    let config = FileStoreConfig { path, capacity: 2 * slot_size, slot_size, queue_depth: 32, io: IoChoice::Auto };
    match FileStore::open(config) {
        Ok(store) => {
            let (memory, offset) = store.alignment();
            format!(
                "{} in {}; O_DIRECT alignment {memory} B (memory), {offset} B (offset)",
                store.io_path(),
                dir.display()
            )
        }
        Err(e) => format!("unavailable in {}: {e}", dir.display()),
    }
}

fn memlock_limit() -> String {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return "unknown".into();
    }
    let show =
        |v: libc::rlim_t| if v == libc::RLIM_INFINITY { "unlimited".to_string() } else { format_size(v as usize) };
    format!(
        "{} (hard {}; CUDA pins through the driver, so this does not cap the host tier)",
        show(limit.rlim_cur),
        show(limit.rlim_max)
    )
}

/// How busy a lender's own kernels keep it now, and what that means for its traffic.
fn lender_busy(device: &dyn tiermem::mechanism::Device, gpu: usize, rate: Option<usize>) -> String {
    let held = match rate {
        Some(rate) => format!("traffic held to {}/s while its kernels run (TIERMEM_PEER_BUSY_RATE)", format_size(rate)),
        None => "traffic never held (TIERMEM_PEER_BUSY_RATE=off)".to_string(),
    };
    match device.gpu_memory(gpu).ok().and_then(|m| m.busy_percent) {
        Some(percent) => format!("its kernels busy {percent}% now; {held}"),
        None => format!("how busy its kernels are is not known here; {held}"),
    }
}
