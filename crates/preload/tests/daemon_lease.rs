//! A program under the interposition is a tenant of the node daemon like any engine: its
//! budget (what `cuMemGetInfo` reports) is the daemon's grant; when another tenant comes, the
//! program gives HBM back at once — idle, from tiermem's own thread — by sending its coldest
//! chunks to the host, every byte kept; when the other leaves, its budget grows back and its
//! chunks come up at its next quiesce points.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiermem::{AllocOptions, Engine, EngineConfig};
use tiermem_tenant::DaemonLink;

const MIB: u64 = 1 << 20;
const SETTLE: Duration = Duration::from_secs(20);

/// The probe's stdin and stdout: one command, one answer.
struct Probe {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Probe {
    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the probe's answer");
        line.trim().to_string()
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("the probe reads its commands");
        self.line()
    }

    /// Asks `command` until the answer is `wanted` (between tries, `then`), or panics showing
    /// the last answer.
    fn ask_until(&mut self, command: &str, wanted: &str, then: impl FnMut(&mut Self)) {
        self.ask_until_that(command, wanted, |answer| answer == wanted, then);
    }

    /// Asks `command` until `good` holds of the answer (between tries, `then`), or panics
    /// showing the last answer and `what` was waited for.
    fn ask_until_that(
        &mut self,
        command: &str,
        what: &str,
        good: impl Fn(&str) -> bool,
        mut then: impl FnMut(&mut Self),
    ) {
        let deadline = Instant::now() + SETTLE;
        loop {
            let answer = self.ask(command);
            if good(&answer) {
                return;
            }
            assert!(Instant::now() < deadline, "{command}: {answer}, waited for {what}");
            then(self);
            std::thread::sleep(Duration::from_millis(150));
        }
    }
}

/// What the daemon at `socket` says of the tenant of process `pid`: HBM used, budget, late.
fn standing(socket: &std::path::Path, pid: u32) -> (u64, u64, bool) {
    let report = tiermem_tenant::query_status(socket).expect("the daemon's status");
    let tenant = report.tenants.iter().find(|t| t.pid == pid).expect("the probe is a tenant");
    let share = report.pools.iter().flat_map(|p| &p.shares).find(|s| s.tenant == tenant.tenant).expect("its share");
    (share.used, share.budget, tenant.late)
}

/// The probe's share of the node's neighbour HBM (the peer pool): (used, budget).
fn peer_standing(socket: &std::path::Path, pid: u32) -> (u64, u64) {
    let report = tiermem_tenant::query_status(socket).expect("the daemon's status");
    let tenant = report.tenants.iter().find(|t| t.pid == pid).expect("the probe is a tenant");
    let pool = report.pools.iter().find(|p| p.tier == tiermem_protocol::Tier::Peer).expect("a peer pool");
    let share = pool.shares.iter().find(|s| s.tenant == tenant.tenant).map_or((0, 0), |s| (s.used, s.budget));
    share
}

/// Waits until `condition` holds of the probe's standing, or panics showing the last one.
fn wait_for_standing(socket: &std::path::Path, pid: u32, condition: impl Fn((u64, u64, bool)) -> bool) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let now = standing(socket, pid);
        if condition(now) {
            return;
        }
        assert!(Instant::now() < deadline, "the probe's standing (used, budget, late): {now:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Another tenant of the same GPU, linked to the daemon at `socket`: an engine on the simulated
/// device that wants 64 MiB and writes 48; its link and buffer.
fn newcomer(socket: &std::path::Path) -> (Arc<Engine>, DaemonLink, tiermem::BufferId) {
    let config = EngineConfig {
        backend: "sim".parse().unwrap(),
        hbm_limit: Some(64 << 20),
        sim_hbm: 64 << 20,
        host_limit: Some(256 << 20),
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::new(config).unwrap());
    let link = DaemonLink::attach(&engine, socket.to_owned(), None).unwrap();
    let (buffer, _) = engine.alloc(48 << 20, AllocOptions::default()).unwrap();
    engine.write(buffer, 0, &[5u8; 48 << 20]).unwrap();
    (engine, link, buffer)
}

/// A daemon sharing 64 MiB of GPU 0 on a socket in a fresh folder, and the folder. Tenants
/// are never idle: a budget changes only as tenants come, go and meet their cuts.
fn daemon(name: &str) -> (tiermem_daemon::Spawned, std::path::PathBuf) {
    daemon_with(name, "")
}

/// `daemon`, its configuration beginning with `settings`.
fn daemon_with(name: &str, settings: &str) -> (tiermem_daemon::Spawned, std::path::PathBuf) {
    daemon_with_tables(name, settings, "")
}

/// `daemon_with`, its configuration ending with `tables` (`[[tenant]]` rules).
fn daemon_with_tables(name: &str, settings: &str, tables: &str) -> (tiermem_daemon::Spawned, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tiermem-preload-lease-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = format!("{settings}\nidle_after_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"64MiB\"\n{tables}");
    let config = tiermem_daemon::Config::parse(&text, "test").unwrap();
    (tiermem_daemon::spawn(&dir.join("d.sock"), config).unwrap(), dir)
}

/// `where-all`'s answer as numbers: chunks in HBM, on GPU 1, on the host.
fn places(answer: &str) -> [u64; 3] {
    let n: Vec<u64> = answer.split(' ').skip(1).step_by(2).map(|n| n.parse().expect(answer)).collect();
    [n[0], n[1], n[2]]
}

/// The probe in `lease` mode linked to the daemon at `socket`, once it is ready; the child (its
/// stderr piped) and the fake driver's folder.
fn start_probe(name: &str, socket: &std::path::Path, env: &[(&str, &str)]) -> (Probe, Child, std::path::PathBuf) {
    let mut all = vec![("TIERMEM_DAEMON", socket.to_str().unwrap()), ("TIERMEM_HBM_LIMIT", "96MiB")];
    all.extend_from_slice(env);
    let (mut command, links) = support::probe_command(name, &["lease"], &all);
    let mut child =
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the probe runs");
    let mut probe = Probe { stdin: child.stdin.take().unwrap(), stdout: BufReader::new(child.stdout.take().unwrap()) };
    assert_eq!(probe.line(), "ready");
    (probe, child, links)
}

/// Ends the probe; what it wrote on stderr.
fn finish(mut probe: Probe, child: Child, links: std::path::PathBuf) -> String {
    writeln!(probe.stdin, "exit").unwrap();
    let output = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&links);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

#[test]
fn the_daemon_grants_the_budget_takes_back_half_for_a_newcomer_and_gives_it_back() {
    let (daemon, dir) = daemon("share");
    let socket = dir.join("d.sock");
    let (mut probe, child, links) = start_probe("lease-share", &socket, &[("TIERMEM_STATS", "1")]);
    // Alone, it gets the daemon's 64 MiB (less than its own limit of 96): all 24 chunks fit.
    assert_eq!(probe.ask("budget"), (64 * MIB).to_string());
    assert_eq!(probe.ask("where"), "hbm 24 host 0");

    // A newcomer demands as much: each gets half. The program gives its excess back while it
    // waits on stdin, launching nothing: the daemon sees it within its budget, not late.
    let (other, link, buffer) = newcomer(&socket);
    let pid = child.id();
    // (On the way its budget may dip below its share while the newcomer holds what it acquired
    // before its own grant came: acquired memory is never taken away.)
    wait_for_standing(&socket, pid, |(used, budget, late)| budget == 32 * MIB && used <= budget && !late);
    let state = link.wait_for(SETTLE, |s| s.budget == Some(32 * MIB) && s.target == Some(32 * MIB));
    assert_eq!(state.budget, Some(32 * MIB), "{state:?}");
    // A dip met first (after the grace its quiesce points get) delays the grant after it.
    probe.ask_until("budget", &(32 * MIB).to_string(), |_| {});
    // The excess leaves on tiermem's own thread, which may still be at it (a loaded machine).
    let hbm_chunks = |answer: &str| -> usize { answer.split(' ').nth(1).and_then(|n| n.parse().ok()).unwrap() };
    probe.ask_until_that("where", "at most 16 chunks in HBM", |answer| hbm_chunks(answer) <= 16, |_| {});
    assert_eq!(probe.ask("verify"), "verified");
    // What it sent down comes back up, within the budget, as kernels use it.
    probe.ask_until("where", "hbm 16 host 8", |probe| assert_eq!(probe.ask("touch"), "touched"));
    assert_eq!(probe.ask("verify"), "verified");

    // The newcomer leaves: the budget grows back, and the chunks come up as kernels use them.
    other.free(buffer).unwrap();
    link.end();
    drop(other);
    probe.ask_until("budget", &(64 * MIB).to_string(), |_| {});
    probe.ask_until("where", "hbm 24 host 0", |probe| assert_eq!(probe.ask("touch"), "touched"));
    assert_eq!(probe.ask("verify"), "verified");

    let stderr = finish(probe, child, links);
    assert!(stderr.contains("GPU 0 leased from tiermemd"), "{stderr}");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The probe under working sets in turns, held for a newcomer's turn (below), and what to end
/// it with.
struct HeldProbe {
    daemon: tiermem_daemon::Spawned,
    dir: std::path::PathBuf,
    probe: Probe,
    child: Child,
    links: std::path::PathBuf,
    newcomer: Option<(Probe, Child, std::path::PathBuf)>,
}

impl HeldProbe {
    /// Working sets in turns: the program (48 MiB) has the GPU's 64 alone; a newcomer's 48 do
    /// not fit beside it, and the newcomer, a program of a higher priority, goes first — so
    /// the program waits, held (it can: its turn will come). Its bytes go to the host meanwhile
    /// (read with copies, never blocked): it keeps only the daemon's least (one of its units,
    /// 4 MiB), the rest going to the newcomer. Two chunks a quiesce point
    /// (`TIERMEM_MIGRATE_BATCH`), so that a turn's pause is seen to bring up everything that
    /// fits all the same.
    fn start(name: &str) -> Self {
        let urgent = "[[tenant]]\nname = \"urgent\"\nlabel = \"urgent\"\npriority = 5\n";
        let (daemon, dir) = daemon_with_tables(name, "hbm_sharing = \"working-sets\"\nturn_ms = 0", urgent);
        let socket = dir.join("d.sock");
        let env = [("TIERMEM_STATS", "1"), ("TIERMEM_MIGRATE_BATCH", "2")];
        let (mut probe, child, links) = start_probe(&format!("lease-{name}"), &socket, &env);
        assert_eq!(probe.ask("where"), "hbm 24 host 0");
        let newcomer = Some(start_probe(&format!("lease-{name}-urgent"), &socket, &[("TIERMEM_LABEL", "urgent")]));
        let held = Self { daemon, dir, probe, child, links, newcomer };
        let deadline = Instant::now() + SETTLE;
        while !held.held() {
            assert!(Instant::now() < deadline, "never held: {:?}", standing(&socket, held.child.id()));
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut held = held;
        // It keeps what the daemon keeps for one held (a unit of 4 MiB at most), the rest sent down.
        let kept_little = |answer: &str| {
            let n: Vec<u32> = answer.split(' ').filter_map(|w| w.parse().ok()).collect();
            matches!(n[..], [hbm, host] if hbm <= 2 && hbm + host == 24)
        };
        held.probe.ask_until_that("where", "two chunks at most in HBM", kept_little, |_| {});
        assert_eq!(held.probe.ask("verify"), "verified");
        held
    }

    fn held(&self) -> bool {
        let report = tiermem_tenant::query_status(&self.dir.join("d.sock")).expect("the daemon's status");
        report.tenants.iter().any(|t| t.pid == self.child.id() && t.held)
    }

    /// Everything back in HBM and intact; its stderr at exit.
    fn finish(mut self) -> String {
        assert!(!self.held());
        assert_eq!(self.probe.ask("where"), "hbm 24 host 0");
        assert_eq!(self.probe.ask("verify"), "verified");
        let stderr = finish(self.probe, self.child, self.links);
        drop(self.daemon);
        let _ = std::fs::remove_dir_all(&self.dir);
        stderr
    }
}

/// The newcomer of a [`HeldProbe`] leaves: the program's turn.
fn leaves(newcomer: &mut Option<(Probe, Child, std::path::PathBuf)>) {
    let (probe, child, links) = newcomer.take().expect("a newcomer");
    finish(probe, child, links);
}

#[test]
fn a_program_waiting_for_its_turn_launches_nothing_until_the_other_working_set_leaves() {
    let mut held = HeldProbe::start("turns");
    let answered = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        writeln!(held.probe.stdin, "touch").unwrap();
        let probe = &mut held.probe;
        let waiter = scope.spawn(|| {
            let answer = probe.line();
            answered.store(true, std::sync::atomic::Ordering::SeqCst);
            answer
        });
        std::thread::sleep(Duration::from_millis(600));
        assert!(!answered.load(std::sync::atomic::Ordering::SeqCst), "a kernel ran while the program waited");
        leaves(&mut held.newcomer);
        assert_eq!(waiter.join().unwrap(), "touched");
    });
    // The launch it waited in took a pause with the budget grown back first: everything came up
    // before its kernels ran.
    let stderr = held.finish();
    assert!(stderr.contains("launches waited for turns 1 time(s)"), "{stderr}");
    assert!(stderr.contains("24 with tiermem pointers, 100.0% of those all in HBM"), "{stderr}");
}

#[test]
fn a_program_that_launched_nothing_while_it_waited_begins_its_turn_with_its_first_launch() {
    let mut held = HeldProbe::start("turns-idle");
    leaves(&mut held.newcomer);
    held.probe.ask_until("budget", &(64 * MIB).to_string(), |_| {});
    let deadline = Instant::now() + SETTLE;
    while held.held() {
        assert!(Instant::now() < deadline, "still held after the newcomer left");
        std::thread::sleep(Duration::from_millis(50));
    }
    // It never waited in a launch, but its first launch since takes the turn's pause.
    assert_eq!(held.probe.ask("touch"), "touched");
    let stderr = held.finish();
    assert!(stderr.contains("launches waited for turns 0 time(s)"), "{stderr}");
    assert!(stderr.contains("24 with tiermem pointers, 100.0% of those all in HBM"), "{stderr}");
}

#[test]
fn spares_made_ahead_take_a_cuts_chunks_and_none_is_made_then() {
    // TIERMEM_SPARES_AHEAD=on: from two seconds after it registered, the link's thread makes a
    // host chunk for each chunk in HBM (what a cut to nothing would send down); the newcomer's
    // cut then sends 8 chunks down into them, making none (without it, none is made ahead).
    let (daemon, dir) = daemon("spares");
    let socket = dir.join("d.sock");
    let env = [("TIERMEM_STATS", "1"), ("TIERMEM_SPARES_AHEAD", "on")];
    let (mut probe, child, links) = start_probe("lease-spares", &socket, &env);
    assert_eq!(probe.ask("where"), "hbm 24 host 0");
    probe.ask_until("host-chunks", "24", |_| {});
    let (other, link, buffer) = newcomer(&socket);
    wait_for_standing(&socket, child.id(), |(used, budget, late)| budget == 32 * MIB && used <= budget && !late);
    probe.ask_until("where", "hbm 16 host 8", |_| {});
    assert_eq!(probe.ask("host-chunks"), "24", "the cut took spares: no host chunk made, none given back");
    assert_eq!(probe.ask("verify"), "verified");
    other.free(buffer).unwrap();
    link.end();
    drop(other);
    let stderr = finish(probe, child, links);
    assert!(stderr.contains("spares ahead of cuts: 24 host chunks made (48.00 MiB)"), "{stderr}");
    assert!(stderr.contains("creating host chunks 0.0 ms (0)"), "{stderr}");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_program_makes_spares_ahead_while_another_waits_for_its_turn_and_not_before() {
    // Working sets in turns that run out (after 16 s here), spares ahead by default
    // (TIERMEM_SPARES_AHEAD=turns): alone, the program makes no host chunk ahead; once a
    // second program's 48 MiB wait for its turn (48 + 48 do not fit 64) and half the first's
    // turn has run, the daemon says `others_wait` and the first makes a host chunk for each of
    // its chunks in HBM, while its turn runs on; the waiting one makes none (without the word:
    // none is made).
    let (daemon, dir) = daemon_with("turn-spares", "hbm_sharing = \"working-sets\"\nturn_ms = 16000");
    let socket = dir.join("d.sock");
    let env = [("TIERMEM_STATS", "1")];
    let (mut first, first_child, first_links) = start_probe("lease-turn-spares-a", &socket, &env);
    assert_eq!(first.ask("where"), "hbm 24 host 0");
    // Past the link's first readying (two seconds after registering) and one more.
    std::thread::sleep(tiermem_tenant::READY_AFTER + tiermem_tenant::READY_EVERY + Duration::from_millis(500));
    assert_eq!(first.ask("host-chunks"), "0", "spares made ahead with nobody waiting");
    let (mut second, second_child, second_links) = start_probe("lease-turn-spares-b", &socket, &env);
    first.ask_until("host-chunks", "24", |_| {});
    assert_eq!(first.ask("where"), "hbm 24 host 0", "its turn runs on");
    assert_eq!(first.ask("verify"), "verified");
    let (_, _, late) = standing(&socket, second_child.id());
    assert!(!late);
    let first_stderr = finish(first, first_child, first_links);
    assert!(first_stderr.contains("spares ahead of cuts: 24 host chunks made (48.00 MiB)"), "{first_stderr}");
    // The first gone, the second has the GPU: its turn, all in HBM, and nothing made ahead.
    second.ask_until("where", "hbm 24 host 0", |p| drop(p.ask("touch")));
    assert_eq!(second.ask("verify"), "verified");
    let second_stderr = finish(second, second_child, second_links);
    assert!(!second_stderr.contains("spares ahead of cuts"), "{second_stderr}");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn by_default_programs_of_two_jobs_take_turns_and_two_of_one_job_share_fairly() {
    // `hbm_sharing = "auto"` (the default): two programs of 48 MiB do not fit 64 together.
    // Of one `tiermem run` (the same TIERMEM_RUN_PID, which its children inherit) they may wait
    // on each other, so they share fairly; of two, one waits for its turn, held.
    for (jobs, in_turns) in [(["7", "7"], false), (["7", "8"], true)] {
        let name = if in_turns { "auto-two-jobs" } else { "auto-one-job" };
        let (daemon, dir) = daemon(name);
        let socket = dir.join("d.sock");
        let (a, a_child, a_links) = start_probe(&format!("lease-{name}-a"), &socket, &[("TIERMEM_RUN_PID", jobs[0])]);
        let (b, b_child, b_links) = start_probe(&format!("lease-{name}-b"), &socket, &[("TIERMEM_RUN_PID", jobs[1])]);
        let deadline = Instant::now() + SETTLE;
        loop {
            let report = tiermem_tenant::query_status(&socket).expect("the daemon's status");
            let held = report.tenants.iter().filter(|t| t.held).count();
            let budgets: Vec<u64> = report.pools.iter().flat_map(|p| &p.shares).map(|s| s.budget).collect();
            let fair = budgets == [32 * MIB, 32 * MIB];
            if (in_turns && held == 1) || (!in_turns && fair) {
                assert!(in_turns || held == 0, "a program of the job held: {held}");
                break;
            }
            assert!(Instant::now() < deadline, "jobs {jobs:?}: {held} held, budgets {budgets:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        finish(b, b_child, b_links);
        finish(a, a_child, a_links);
        drop(daemon);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_smaller_budget_that_cannot_be_met_is_not_acknowledged_and_says_why() {
    let (daemon, dir) = daemon("unmet");
    let socket = dir.join("d.sock");
    let (mut probe, child, links) = start_probe("lease-unmet", &socket, &[("TIERMEM_MIGRATE", "off")]);
    assert_eq!(probe.ask("where"), "hbm 24 host 0");
    let (_other, link, _) = newcomer(&socket);
    // Past the daemon's deadline (2 s) the program is late, counted at what it holds.
    let pid = child.id();
    wait_for_standing(&socket, pid, |(used, budget, late)| late && used == 48 * MIB && budget < used);
    assert_eq!(probe.ask("where"), "hbm 24 host 0", "nothing moved");
    assert_eq!(probe.ask("verify"), "verified");
    link.end();
    let stderr = finish(probe, child, links);
    assert!(stderr.contains("TIERMEM_MIGRATE=off"), "{stderr}");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_budget_cut_during_a_stream_capture_is_met_at_the_next_synchronization() {
    let (daemon, dir) = daemon("capture");
    let socket = dir.join("d.sock");
    let (mut probe, child, links) = start_probe("lease-capture", &socket, &[]);
    assert_eq!(probe.ask("capture"), "capturing");
    let (_other, _link, _) = newcomer(&socket);
    // Nothing may move while the capture lasts: the cut goes unmet, the program is late.
    let pid = child.id();
    wait_for_standing(&socket, pid, |(used, budget, late)| late && used == 48 * MIB && budget < used);
    assert_eq!(probe.ask("where"), "hbm 24 host 0", "nothing moved during the capture");
    // The capture over, the program's next synchronization sheds what is over the budget —
    // though no chunk of it was on the host to watch for.
    assert_eq!(probe.ask("end-capture"), "captured");
    probe.ask_until("sync", "synced", |_| {});
    wait_for_standing(&socket, pid, |(used, budget, _)| used <= budget);
    let (_, budget, _) = standing(&socket, pid);
    let hbm = probe.ask("where");
    let in_hbm: u64 = hbm.split(' ').nth(1).and_then(|n| n.parse().ok()).unwrap();
    assert!(in_hbm * 2 * MIB <= budget, "{hbm} within {budget}");
    assert_eq!(probe.ask("verify"), "verified");
    let stderr = finish(probe, child, links);
    assert!(stderr.contains("stream capture"), "{stderr}");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_program_that_synchronizes_meets_a_cut_at_its_own_quiesce_point() {
    let (daemon, dir) = daemon("own-quiesce");
    let socket = dir.join("d.sock");
    // The link would wait a minute before shedding itself: only the program's synchronizations
    // can meet the cut within the daemon's deadline (2 s).
    let (mut probe, child, links) = start_probe("lease-own", &socket, &[("TIERMEM_SHED_GRACE_MS", "60000")]);
    assert_eq!(probe.ask("where"), "hbm 24 host 0");
    let (_other, link, _) = newcomer(&socket);
    let pid = child.id();
    probe.ask_until("budget", &(32 * MIB).to_string(), |probe| assert_eq!(probe.ask("sync"), "synced"));
    probe.ask_until("where", "hbm 16 host 8", |probe| assert_eq!(probe.ask("sync"), "synced"));
    let (used, budget, late) = standing(&socket, pid);
    assert!(!late && used <= budget, "met in time, by the program: ({used}, {budget}, {late})");
    assert_eq!(probe.ask("verify"), "verified");
    link.end();
    finish(probe, child, links);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cut_met_at_the_programs_synchronization_sends_down_what_its_cycle_does_not_touch() {
    let (daemon, dir) = daemon("by-plan");
    let socket = dir.join("d.sock");
    let (mut probe, child, links) = start_probe("lease-plan", &socket, &[("TIERMEM_SHED_GRACE_MS", "60000")]);
    // A loop over the two buffers at the lowest addresses (which a shed knowing nothing would
    // send down first), all in HBM: linked to a daemon, its cycles are recorded anyway, so that
    // a cut can be planned by them.
    let order: Vec<usize> = probe.ask("by-address").split(' ').map(|i| i.parse().unwrap()).collect();
    let touch = format!("touch-only {},{}", order[0], order[1]);
    for _ in 0..3 {
        assert_eq!(probe.ask(&touch), "touched");
    }
    assert_eq!(probe.ask("where-each"), "hbm 8 8 8");
    let (_other, link, _) = newcomer(&socket);
    probe.ask_until("budget", &(32 * MIB).to_string(), |probe| assert_eq!(probe.ask(&touch), "touched"));
    probe.ask_until("where", "hbm 16 host 8", |probe| assert_eq!(probe.ask(&touch), "touched"));
    // The buffer the loop never touches went down; the loop's own stayed.
    let mut expected = ["8"; 3];
    expected[order[2]] = "0";
    assert_eq!(probe.ask("where-each"), format!("hbm {}", expected.join(" ")));
    assert_eq!(probe.ask("verify"), "verified");
    link.end();
    finish(probe, child, links);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_daemon_shares_out_neighbours_hbm_and_a_cut_is_given_back_to_the_host() {
    let dir = std::env::temp_dir().join(format!("tiermem-preload-lease-peer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("d.sock");
    // 16 MiB of GPU 0's HBM and 24 MiB of neighbours' HBM shared out; each program's GPU 1
    // offers 64 MiB. Fair share: two programs would otherwise take turns.
    let config =
        "hbm_sharing = \"fair\"\nidle_after_ms = 0\n[tiers]\npeer = \"24MiB\"\n[[gpu]]\nindex = 0\nhbm = \"16MiB\"";
    let daemon = tiermem_daemon::spawn(&socket, tiermem_daemon::Config::parse(config, "test").unwrap()).unwrap();
    let env = [
        ("TIERMEM_FAKE_GPUS", "2"),
        ("TIERMEM_FAKE_HBM", "256M"),
        ("TIERMEM_PEERS", "1"),
        ("TIERMEM_PEER_RESERVE", "0"),
        ("TIERMEM_PEER_LIMIT", "64MiB"),
        ("TIERMEM_STATS", "1"),
    ];
    let (mut a, a_child, a_links) = start_probe("lease-peer-a", &socket, &env);
    let a_pid = a_child.id();
    // Alone: 8 chunks in HBM; of the 32 MiB beyond, 24 on GPU 1 (its peer budget), 8 on the host.
    let wait_peer = |pid: u32, wanted: u64| {
        let deadline = Instant::now() + SETTLE;
        loop {
            let (used, budget) = peer_standing(&socket, pid);
            if budget == wanted && used <= budget {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "peer (used, budget): ({used}, {budget}), waited for a budget of {wanted}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_peer(a_pid, 24 * MIB);
    a.ask_until("where-all", "hbm 8 neighbour 12 host 4", |_| {});
    assert_eq!(a.ask("verify"), "verified");

    // A second program: each gets half of both pools; A gives 12 MiB of GPU 1 back (to the host)
    // while it waits on stdin, launching nothing.
    let (mut b, b_child, b_links) = start_probe("lease-peer-b", &socket, &env);
    wait_peer(a_pid, 12 * MIB);
    wait_peer(b_child.id(), 12 * MIB);
    wait_for_standing(&socket, a_pid, |(used, budget, late)| budget == 8 * MIB && used <= budget && !late);
    for probe in [&mut a, &mut b] {
        probe.ask_until_that(
            "where-all",
            "at most 4 chunks in HBM and 6 on GPU 1",
            |answer| matches!(places(answer), [hbm, neighbour, _] if hbm <= 4 && neighbour <= 6),
            |_| {},
        );
        assert_eq!(probe.ask("verify"), "verified");
    }
    // Kernels touch everything: what comes up and goes down keeps within both budgets.
    assert_eq!(a.ask("touch"), "touched");
    let [hbm, neighbour, host] = places(&a.ask("where-all"));
    assert!(hbm <= 4 && neighbour <= 6 && hbm + neighbour + host == 24, "{hbm} {neighbour} {host}");
    assert_eq!(a.ask("verify"), "verified");

    let b_stderr = finish(b, b_child, b_links);
    assert!(b_stderr.contains("neighbours' HBM lent: GPU 1 to GPU 0"), "{b_stderr}");
    let a_stderr = finish(a, a_child, a_links);
    assert!(a_stderr.contains("given back to lenders"), "{a_stderr}");
    assert!(!a_stderr.contains("still lent over the budget"), "{a_stderr}");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
