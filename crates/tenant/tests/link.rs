//! Engines on the simulated device linked to an in-process daemon: budgets reach the engines
//! and converge to fair shares, a tenant that leaves gives its share back, and a link survives
//! the daemon's restart (keeping its budget while the daemon is away).

use std::sync::Arc;
use std::time::Duration;
use tiermem::Tier;
use tiermem::{AllocOptions, Engine, EngineConfig};
use tiermem_tenant::{DaemonLink, LinkState};

mod support;

use support::{engine, socket};

const MIB: u64 = 1 << 20;
const SETTLE: Duration = Duration::from_secs(20);

/// A daemon on `path` sharing `hbm` of GPU 0, until the handle is dropped (it then closes every
/// connection, as a daemon that exits does).
fn start_daemon(path: &std::path::Path, hbm: &str) -> tiermem_daemon::Spawned {
    let config = tiermem_daemon::Config::parse(&format!("[[gpu]]\nindex = 0\nhbm = \"{hbm}\""), "test").unwrap();
    tiermem_daemon::spawn(path, config).unwrap()
}

fn settled_at(bytes: u64) -> impl Fn(&LinkState) -> bool {
    move |s| s.budget == Some(bytes) && s.target == Some(bytes)
}

#[test]
fn budgets_reach_the_engines_and_a_leaver_gives_its_share_back_with_its_engine() {
    let path = socket("share");
    let _daemon = start_daemon(&path, "48MiB");
    let a = engine();
    let link_a = DaemonLink::attach(&a, path.clone(), None).unwrap();
    let state = link_a.wait_for(SETTLE, settled_at(48 * MIB));
    assert_eq!(state.budget, Some(48 * MIB), "{state:?}");
    assert_eq!(a.hbm_cap() as u64, 48 * MIB);
    // A fills its budget, then B comes: A shrinks to half (its data moves down), B grows.
    let (buffer, _) = a.alloc(40 << 20, AllocOptions::default()).unwrap();
    for offset in (0..40 << 20).step_by(8 << 20) {
        a.write(buffer, offset, &[7u8; 8 << 20]).unwrap();
    }
    // Between its reports, A's link pins host room for what its HBM holds with no copy below,
    // so that the cut to come finds it pinned (evict_room.rs).
    let until = std::time::Instant::now() + SETTLE;
    while a.stats().host_pinned_bytes < 40 << 20 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let pinned_ahead = a.stats().host_pinned_bytes;
    assert!(pinned_ahead >= 40 << 20, "room pinned ahead: {pinned_ahead} bytes");
    // The daemon's status shows it, as held and ready, from A's next report.
    let shown = |ready: u64| {
        let report = tiermem_tenant::query_status(&path).unwrap();
        report.tenants.iter().any(|t| t.host_ready >= ready && t.host_pinned >= t.host_ready)
    };
    while !shown(40 << 20) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(shown(40 << 20), "{:?}", tiermem_tenant::query_status(&path).unwrap().tenants);
    let b = engine();
    let link_b = DaemonLink::attach(&b, path.clone(), None).unwrap();
    let (b_buffer, _) = b.alloc(40 << 20, AllocOptions::default()).unwrap();
    link_b.wait_for(SETTLE, settled_at(24 * MIB));
    link_a.wait_for(SETTLE, settled_at(24 * MIB));
    assert_eq!((a.hbm_cap() as u64, b.hbm_cap() as u64), (24 * MIB, 24 * MIB));
    assert!(a.stats().tiers[Tier::Hbm].used_bytes as u64 <= 24 * MIB, "A met its budget");
    assert_eq!(a.stats().host_pinned_bytes, pinned_ahead, "A's cut pinned nothing more");
    let mut back = vec![0u8; 8 << 20];
    for offset in (0..40 << 20).step_by(8 << 20) {
        a.read(buffer, offset, &mut back).unwrap();
        assert!(back.iter().all(|&x| x == 7), "A's data survived the cut");
    }
    // B's handle goes, but B's engine still holds its memory: the lease stays.
    drop(link_b);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(link_a.state().budget, Some(24 * MIB), "B still leases its half");
    // B's engine goes: its lease ends with it, and A gets everything back.
    b.free(b_buffer).unwrap();
    drop(b);
    let state = link_a.wait_for(SETTLE, settled_at(48 * MIB));
    assert_eq!(state.budget, Some(48 * MIB), "{state:?}");
}

#[test]
fn a_link_keeps_its_budget_while_the_daemon_restarts_and_reconnects() {
    let path = socket("restart");
    let daemon = start_daemon(&path, "32MiB");
    let a = engine();
    let link = DaemonLink::attach(&a, path.clone(), Some("restart-test".into())).unwrap();
    link.wait_for(SETTLE, settled_at(32 * MIB));
    drop(daemon);
    let state = link.wait_for(SETTLE, |s| !s.connected);
    assert!(!state.connected);
    assert_eq!(a.hbm_cap() as u64, 32 * MIB, "the budget stays while the daemon is away");
    let _daemon = start_daemon(&path, "20MiB");
    let state = link.wait_for(SETTLE, |s| s.sessions == 2 && s.budget == Some(20 * MIB));
    assert!(state.connected && state.sessions == 2, "{state:?}");
    assert_eq!(a.hbm_cap() as u64, 20 * MIB);
    // Ended on purpose: the daemon sees the tenant leave although its engine lives on.
    link.end();
    let deadline = std::time::Instant::now() + SETTLE;
    while !tiermem_tenant::query_status(&path).unwrap().tenants.is_empty() {
        assert!(std::time::Instant::now() < deadline, "the tenant should have left");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An engine whose readying for cuts (pinning room ahead) takes until it is let go.
struct SlowToReady {
    engine: Arc<Engine>,
    readying: std::sync::atomic::AtomicBool,
    let_go: std::sync::atomic::AtomicBool,
}

impl tiermem_tenant::Tenant for SlowToReady {
    fn registration(&self) -> tiermem_tenant::Registration {
        tiermem_tenant::Tenant::registration(&*self.engine)
    }
    fn usage(&self) -> tiermem_tenant::Usage {
        tiermem_tenant::Tenant::usage(&*self.engine)
    }
    fn meet_budget(&self, tier: tiermem_protocol::Tier, bytes: u64) -> Result<(), String> {
        tiermem_tenant::Tenant::meet_budget(&*self.engine, tier, bytes)
    }
    fn ready_for_cuts(&self) {
        use std::sync::atomic::Ordering;
        self.readying.store(true, Ordering::Release);
        let until = std::time::Instant::now() + SETTLE;
        while !self.let_go.load(Ordering::Acquire) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.readying.store(false, Ordering::Release);
    }
}

#[test]
fn a_budget_is_met_while_the_tenant_is_still_readying_for_cuts() {
    use std::sync::atomic::Ordering;
    let path = socket("readying");
    let _daemon = start_daemon(&path, "48MiB");
    let slow = Arc::new(SlowToReady { engine: engine(), readying: false.into(), let_go: false.into() });
    let link = DaemonLink::attach(&slow, path.clone(), None).unwrap();
    link.wait_for(SETTLE, settled_at(48 * MIB));
    let (buffer, _) = slow.engine.alloc(40 << 20, AllocOptions::default()).unwrap();
    slow.engine.write(buffer, 0, &[3u8; 40 << 20]).unwrap();
    let until = std::time::Instant::now() + SETTLE;
    while !slow.readying.load(Ordering::Acquire) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(slow.readying.load(Ordering::Acquire), "the link readies its tenant once it has run a while");
    // A newcomer: the slow tenant is cut to half while its readying has not returned.
    let b = engine();
    let _link_b = DaemonLink::attach(&b, path.clone(), None).unwrap();
    let (_b_buffer, _) = b.alloc(40 << 20, AllocOptions::default()).unwrap();
    let state = link.wait_for(Duration::from_secs(5), settled_at(24 * MIB));
    assert_eq!(state.budget, Some(24 * MIB), "the cut waited for the readying: {state:?}");
    assert!(slow.readying.load(Ordering::Acquire), "still readying when the cut was met");
    assert!(slow.engine.stats().tiers[Tier::Hbm].used_bytes as u64 <= 24 * MIB);
    slow.let_go.store(true, Ordering::Release);
    let mut back = vec![0u8; 40 << 20];
    slow.engine.read(buffer, 0, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 3), "the cut tenant's data survived");
}

/// An engine on a simulated node of two GPUs whose neighbour lends it 32 MiB (one slab).
fn borrowing_engine() -> Arc<Engine> {
    let config = EngineConfig {
        backend: "sim".parse().unwrap(),
        sim_gpus: 2,
        sim_hbm: 64 << 20,
        hbm_limit: Some(16 << 20),
        host_limit: Some(256 << 20),
        peer_reserve: Some(0),
        peer_limit: Some(32 << 20),
        peer_clean: false,
        ..EngineConfig::default()
    };
    Arc::new(Engine::new(config).unwrap())
}

fn borrowed(engine: &Engine) -> u64 {
    engine.stats().tiers.get(Tier::Peer).map_or(0, |t| t.used_bytes as u64)
}

fn wait_borrowing(engine: &Engine, bytes: u64) {
    let deadline = std::time::Instant::now() + SETTLE;
    while borrowed(engine) != bytes {
        assert!(std::time::Instant::now() < deadline, "borrowing {} bytes, not {bytes}", borrowed(engine));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn what_neighbours_lend_is_shared_out_by_the_daemon_and_given_back_when_asked() {
    let path = socket("peer");
    let config = "[tiers]\npeer = \"32MiB\"\n[[gpu]]\nindex = 0\nhbm = \"64MiB\"";
    let _daemon = tiermem_daemon::spawn(&path, tiermem_daemon::Config::parse(config, "test").unwrap()).unwrap();
    let a = borrowing_engine();
    assert_eq!(a.peer_offered(), 32 << 20, "{:?}", a.peer_notes());
    let _link_a = DaemonLink::attach(&a, path.clone(), None).unwrap();
    let (buffer, _) = a.alloc(48 << 20, AllocOptions::default()).unwrap();
    for offset in (0..48 << 20).step_by(8 << 20) {
        a.write(buffer, offset, &[9u8; 8 << 20]).unwrap();
    }
    assert_eq!(borrowed(&a), 32 << 20, "alone, A borrows all its neighbour lends");
    // B wants to borrow too: half each is less than a slab, so A gives its slab back.
    let b = borrowing_engine();
    let _link_b = DaemonLink::attach(&b, path.clone(), None).unwrap();
    let (_b_buffer, _) = b.alloc(48 << 20, AllocOptions::default()).unwrap();
    wait_borrowing(&a, 0);
    let mut back = vec![0u8; 8 << 20];
    for offset in (0..48 << 20).step_by(8 << 20) {
        a.read(buffer, offset, &mut back).unwrap();
        assert!(back.iter().all(|&x| x == 9), "A's data survived giving its neighbour's HBM back");
    }
    // B leaves: A may borrow everything again.
    drop(_link_b);
    drop(b);
    let deadline = std::time::Instant::now() + SETTLE;
    while a.peer_lenders().iter().map(|l| l.1).sum::<usize>() != 32 << 20 {
        assert!(std::time::Instant::now() < deadline, "A's budget should have grown back: {:?}", a.peer_lenders());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn engine_with_file(name: &str) -> Arc<Engine> {
    let file = std::env::temp_dir().join(format!("tiermem-link-{name}-{}.tier", std::process::id()));
    let config = EngineConfig {
        backend: "sim".parse().unwrap(),
        hbm_limit: Some(64 << 20),
        sim_hbm: 64 << 20,
        host_limit: Some(256 << 20),
        file: Some(file),
        file_limit: 256 << 20,
        ..EngineConfig::default()
    };
    Arc::new(Engine::new(config).unwrap())
}

fn host_used(engine: &Engine) -> u64 {
    engine.stats().tiers[Tier::Host].used_bytes as u64
}

#[test]
fn the_nodes_pinned_host_memory_is_shared_out_and_met_by_spilling_to_the_file() {
    let path = socket("host");
    let config = "[tiers]\nhost = \"64MiB\"\n[[gpu]]\nindex = 0\nhbm = \"32MiB\"";
    let _daemon = tiermem_daemon::spawn(&path, tiermem_daemon::Config::parse(config, "test").unwrap()).unwrap();
    let write = |engine: &Engine, byte: u8| {
        let (buffer, _) = engine.alloc(80 << 20, AllocOptions::default()).unwrap();
        let bytes = vec![byte; 8 << 20];
        for offset in (0..80 << 20).step_by(8 << 20) {
            engine.write(buffer, offset, &bytes).unwrap();
        }
        buffer
    };
    let a = engine_with_file("host-a");
    let link_a = DaemonLink::attach(&a, path.clone(), None).unwrap();
    link_a.wait_for(SETTLE, settled_at(32 * MIB));
    let a_buffer = write(&a, 5);
    let b = engine_with_file("host-b");
    let link_b = DaemonLink::attach(&b, path.clone(), None).unwrap();
    link_b.wait_for(SETTLE, settled_at(16 * MIB)); // half the GPU each (A gave its half back)
    let b_buffer = write(&b, 6);
    // Together they hold 128 MiB below HBM against 64 MiB of host: each is held to about half.
    let deadline = std::time::Instant::now() + SETTLE;
    while host_used(&a) + host_used(&b) > 64 * MIB {
        assert!(std::time::Instant::now() < deadline, "host use {} + {}", host_used(&a), host_used(&b));
        std::thread::sleep(Duration::from_millis(20));
    }
    for (engine, buffer, byte) in [(&a, a_buffer, 5u8), (&b, b_buffer, 6u8)] {
        assert!(engine.stats().tiers.get(Tier::File).is_some_and(|f| f.used_bytes > 0), "spilled to the file");
        let mut back = vec![0u8; 8 << 20];
        for offset in (0..80 << 20).step_by(8 << 20) {
            engine.read(buffer, offset, &mut back).unwrap();
            assert!(back.iter().all(|&x| x == byte), "every byte survived the spill");
        }
    }
}
