//! Hostile-input runs of a command-line program: every [`Case`] runs the program once, in its
//! own folder, and is checked for what a user's bad file must never cause.
//!
//! A [`Runner`] starts each case's command
//! - under an **address-space ceiling** (`ulimit -v`, through `sh -c 'ulimit -v KIB && exec
//!   "$0" "$@"'`), so an input that makes the program allocate without bound fails the
//!   allocation instead of exhausting the machine;
//! - with a **deadline**: a process still running then is killed and the case fails (a hang, or
//!   a runaway computation);
//! - while polling its **peak resident memory** (`VmHWM` in `/proc/<pid>/status`, every 20 ms).
//!
//! and then checks, against the case's [`Expect`]ation:
//! - the **exit status**: 1 for an error, 0 for an accepted input; death by a signal (an abort
//!   on a failed allocation, a stack overflow) and any other status are defects;
//! - that stderr holds **no panic** (`panicked at`, or the `RUST_BACKTRACE` hint printed with
//!   one);
//! - that stderr **names the culprit**: one of the case's strings (a path, a file name, a
//!   dotted config key);
//! - that **nothing was lost**: every entry under the case's folder — files with their SHA-256,
//!   folders, symbolic links with their targets, FIFOs — is as it was, except inside the
//!   folders the case lets the program write ([`Case::output`]); files planted inside those
//!   ([`Case::keep`]) must survive too. Entries the program adds are not defects.
//!
//! Cases run a few at a time ([`Runner::workers`]). [`Verdicts::finish`] prints a summary (the
//! case count, the peak memory of the worst accepted input, the slowest cases) and panics with
//! every failing case, grouped by what the program did, so one run reports every defect.
//!
//! The module also makes the hostile files themselves: FIFOs ([`fifo`]), symbolic links that
//! point at themselves ([`symlink_loop`]), and PNG files of any header ([`png_bytes`], with
//! [`zlib`] and [`zlib_zeros`] for an inflate bomb).
//!
//! ```
//! use std::time::Duration;
//! use kappa_testkit::cli_cases::{Case, Runner};
//!
//! let dir = std::env::temp_dir().join(format!("kappa-cli-cases-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(dir.join("job.toml"), "lr = -1\n")?;
//! // `sh` stands in for a program that refuses the file, naming the key.
//! let case = Case::new("config", "a negative lr", &dir)
//!     .args(["-c", "echo 'error: job.toml: train.lr must be > 0' >&2; exit 1"])
//!     .error(["train.lr"]);
//! let verdicts = Runner::new("sh", dir.join("logs"))
//!     .deadline(Duration::from_secs(20))
//!     .run(vec![case]);
//! assert_eq!(verdicts.finish(), 1);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// What a case's command must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Fail with exit status 1, and name one of these culprits on stderr (none: any message).
    Error(Vec<String>),
    /// Succeed (exit status 0).
    Accepted,
    /// Either succeed, or fail with status 1 naming one of these culprits: for values that are
    /// legal but extreme, where refusing them is as right as running them.
    Either(Vec<String>),
}

/// One run of the program: its arguments, the folder it runs in, and what it must do.
#[derive(Clone, Debug)]
pub struct Case {
    /// A group of related cases (`"train config"`, `"PNG folder"`), for the summary.
    pub group: String,
    /// What the case is, in a few words.
    pub label: String,
    /// The folder the command runs in; everything under it is checked for changes.
    pub dir: PathBuf,
    /// The arguments.
    pub args: Vec<OsString>,
    /// What the command must do.
    pub expect: Expect,
    /// Folders (or files) the command may write, replace or delete.
    pub output: Vec<PathBuf>,
    /// Entries inside `output` that must survive all the same (a user's file in a run folder).
    pub keep: Vec<PathBuf>,
}

impl Case {
    /// A case of `group`, described by `label`, run in `dir`; it expects an error naming no
    /// culprit in particular until [`Case::error`], [`Case::accepted`] or [`Case::either`].
    pub fn new(
        group: impl Into<String>,
        label: impl Into<String>,
        dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            group: group.into(),
            label: label.into(),
            dir: dir.into(),
            args: Vec::new(),
            expect: Expect::Error(Vec::new()),
            output: Vec::new(),
            keep: Vec::new(),
        }
    }

    /// One more argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Expects exit status 1 with one of `culprits` on stderr.
    pub fn error<I, S>(mut self, culprits: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.expect = Expect::Error(culprits.into_iter().map(Into::into).collect());
        self
    }

    /// Expects success.
    pub fn accepted(mut self) -> Self {
        self.expect = Expect::Accepted;
        self
    }

    /// Expects success, or exit status 1 with one of `culprits` on stderr.
    pub fn either<I, S>(mut self, culprits: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.expect = Expect::Either(culprits.into_iter().map(Into::into).collect());
        self
    }

    /// Lets the command write `path` (a folder of its own output).
    pub fn output(mut self, path: impl Into<PathBuf>) -> Self {
        self.output.push(path.into());
        self
    }

    /// Requires `path`, inside an output folder, to survive unchanged.
    pub fn keep(mut self, path: impl Into<PathBuf>) -> Self {
        self.keep.push(path.into());
        self
    }

    /// Whether `path` is compared before and after: outside every output folder, or kept.
    fn watched(&self, path: &Path) -> bool {
        !self.output.iter().any(|o| path.starts_with(o))
            || self.keep.iter().any(|k| path.starts_with(k))
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it.
    Signal(i32),
    /// It was still running at the deadline and was killed.
    Killed,
}

/// One run of a command, measured.
#[derive(Clone, Debug)]
pub struct Execution {
    /// How it ended.
    pub ended: Ended,
    /// Its standard error.
    pub stderr: String,
    /// The peak resident memory seen (`VmHWM`), in KiB (0 where `/proc` has none).
    pub peak_rss_kib: u64,
    /// The peak address space seen (`VmPeak`), in KiB (0 where `/proc` has none).
    pub peak_vm_kib: u64,
    /// Wall time.
    pub seconds: f64,
}

/// What was wrong with a case, by kind of behaviour (the groups of the failure report).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Defect {
    /// Still running at the deadline.
    Hang,
    /// Ended by a signal (an abort, a crash).
    Signal(i32),
    /// A panic message on stderr.
    Panic,
    /// Exit status 0 where an error is due: the input was accepted silently.
    AcceptedSilently,
    /// An error where the input is legitimate.
    Refused,
    /// An exit status other than 0 and 1.
    Status(i32),
    /// An error whose message names none of the culprits.
    NamesNothing(Vec<String>),
    /// Entries under the case's folder that changed or disappeared.
    FilesLost(Vec<String>),
    /// The case could not be run (a setup error).
    NotRun(String),
}

impl Defect {
    /// The heading of this kind of defect in the report.
    pub fn kind(&self) -> &'static str {
        match self {
            Defect::Hang => "killed at the deadline (hang or runaway work)",
            Defect::Signal(_) => "died of a signal (abort, crash)",
            Defect::Panic => "panicked",
            Defect::AcceptedSilently => "exit 0 where an error is due (accepted silently)",
            Defect::Refused => "an error where the input is legitimate",
            Defect::Status(_) => "exit status other than 0 or 1",
            Defect::NamesNothing(_) => "error that does not name the culprit",
            Defect::FilesLost(_) => "files lost or changed",
            Defect::NotRun(_) => "case not run",
        }
    }

    fn detail(&self) -> String {
        match self {
            Defect::Signal(s) => format!("signal {s}"),
            Defect::Status(s) => format!("status {s}"),
            Defect::NamesNothing(c) => format!("wanted one of {c:?}"),
            Defect::FilesLost(changes) => changes.join("; "),
            Defect::NotRun(why) => why.clone(),
            other => other.kind().to_string(),
        }
    }
}

/// A case's verdict.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// The case's group.
    pub group: String,
    /// The case's label.
    pub label: String,
    /// What it expected.
    pub expect: Expect,
    /// The run.
    pub execution: Option<Execution>,
    /// What was wrong (empty: fine).
    pub defects: Vec<Defect>,
}

impl Verdict {
    /// The last non-empty line of stderr, shortened.
    fn last_line(&self) -> String {
        let stderr = self.execution.as_ref().map_or("", |e| e.stderr.as_str());
        let line = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("(stderr empty)");
        shorten(line, 400)
    }
}

/// `text` cut to about `max` bytes (at a character boundary), with the length said.
fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let cut = text.floor_char_boundary(max);
    format!("{}… ({} bytes)", &text[..cut], text.len())
}

/// Runs cases: the program, the deadline, the ceiling, and how many at a time.
#[derive(Clone, Debug)]
pub struct Runner {
    binary: PathBuf,
    logs: PathBuf,
    deadline: Duration,
    address_space_kib: Option<u64>,
    workers: usize,
    env_remove: Vec<OsString>,
}

/// How often the peak memory is read.
const POLL: Duration = Duration::from_millis(20);

impl Runner {
    /// Runs `binary`, writing each case's stdout and stderr under `logs` (keep it outside the
    /// cases' folders). Defaults: a 60 s deadline, no ceiling, one case at a time, and
    /// `RUST_BACKTRACE` removed from the environment (a panic prints its hint either way).
    pub fn new(binary: impl Into<PathBuf>, logs: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            logs: logs.into(),
            deadline: Duration::from_secs(60),
            address_space_kib: None,
            workers: 1,
            env_remove: vec!["RUST_BACKTRACE".into()],
        }
    }

    /// Kills a case's process after `deadline`.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Runs every case under `ulimit -v kib`.
    pub fn address_space_kib(mut self, kib: u64) -> Self {
        self.address_space_kib = Some(kib);
        self
    }

    /// Runs `n` cases at a time.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// Removes `var` from the environment of every case.
    pub fn env_remove(mut self, var: impl Into<OsString>) -> Self {
        self.env_remove.push(var.into());
        self
    }

    /// Runs every case and returns the verdicts, in the cases' order. Prints one line per
    /// failing case as it ends.
    pub fn run(&self, cases: Vec<Case>) -> Verdicts {
        let next = AtomicUsize::new(0);
        let slots: Mutex<Vec<Option<Verdict>>> = Mutex::new(vec![None; cases.len()]);
        std::thread::scope(|scope| {
            for _ in 0..self.workers.min(cases.len().max(1)) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(case) = cases.get(i) else { break };
                    let verdict = self.judge(i, case);
                    if !verdict.defects.is_empty() {
                        let kinds: Vec<&str> = verdict.defects.iter().map(Defect::kind).collect();
                        eprintln!("  ✗ [{}] {}: {}", case.group, case.label, kinds.join(", "));
                    }
                    let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
                    slots[i] = Some(verdict);
                });
            }
        });
        let slots = slots.into_inner().unwrap_or_else(|p| p.into_inner());
        Verdicts {
            verdicts: slots.into_iter().flatten().collect(),
            deadline: self.deadline,
        }
    }

    /// Runs case number `index` and checks it.
    fn judge(&self, index: usize, case: &Case) -> Verdict {
        let before = Snapshot::of(&case.dir, &|p| case.watched(p));
        let mut verdict = Verdict {
            group: case.group.clone(),
            label: case.label.clone(),
            expect: case.expect.clone(),
            execution: None,
            defects: Vec::new(),
        };
        match self.execute(&format!("{index:04}"), &case.dir, &case.args) {
            Ok(execution) => {
                let after = Snapshot::of(&case.dir, &|p| case.watched(p));
                verdict.defects = check(&case.expect, &execution, before.changes(&after));
                verdict.execution = Some(execution);
            }
            Err(why) => verdict.defects.push(Defect::NotRun(why)),
        }
        verdict
    }

    /// Runs the program once with `args` in `dir` under this runner's limits; `name` names its
    /// log files.
    pub fn execute(&self, name: &str, dir: &Path, args: &[OsString]) -> Result<Execution, String> {
        fs::create_dir_all(&self.logs).map_err(|e| format!("{}: {e}", self.logs.display()))?;
        let stdout = self.logs.join(format!("{name}.stdout"));
        let stderr = self.logs.join(format!("{name}.stderr"));
        let file = |p: &Path| fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
        let mut command = match self.address_space_kib {
            Some(kib) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
                    .arg(&self.binary);
                c
            }
            None => Command::new(&self.binary),
        };
        command
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(file(&stdout)?)
            .stderr(file(&stderr)?);
        for var in &self.env_remove {
            command.env_remove(var);
        }
        let started = Instant::now();
        let child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.binary.display()))?;
        let (ended, peak) = self.watch(child, started)?;
        let bytes = fs::read(&stderr).map_err(|e| format!("{}: {e}", stderr.display()))?;
        Ok(Execution {
            ended,
            stderr: String::from_utf8_lossy(&bytes).into_owned(),
            peak_rss_kib: peak.rss,
            peak_vm_kib: peak.vm,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Polls `child` until it ends or the deadline passes (then kills it).
    fn watch(&self, mut child: Child, started: Instant) -> Result<(Ended, Peak), String> {
        let mut peak = Peak::default();
        loop {
            peak.update(child.id());
            match child.try_wait().map_err(|e| format!("waiting: {e}"))? {
                Some(status) => return Ok((ended(status), peak)),
                None if started.elapsed() > self.deadline => {
                    // Already ended between the two calls, or killed now: either way it is
                    // reaped by the wait.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Ok((Ended::Killed, peak));
                }
                None => std::thread::sleep(POLL),
            }
        }
    }
}

fn ended(status: ExitStatus) -> Ended {
    match (status.code(), status.signal()) {
        (Some(code), _) => Ended::Exited(code),
        (None, Some(signal)) => Ended::Signal(signal),
        (None, None) => Ended::Exited(-1),
    }
}

/// The largest `VmHWM` and `VmPeak` seen.
#[derive(Clone, Copy, Debug, Default)]
struct Peak {
    rss: u64,
    vm: u64,
}

impl Peak {
    fn update(&mut self, pid: u32) {
        let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
            return;
        };
        for line in status.lines() {
            let kib = || {
                line.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("VmHWM:") {
                self.rss = self.rss.max(kib());
            } else if line.starts_with("VmPeak:") {
                self.vm = self.vm.max(kib());
            }
        }
    }
}

/// The defects of one execution under `expect`, given what changed on disk.
fn check(expect: &Expect, execution: &Execution, lost: Vec<String>) -> Vec<Defect> {
    let mut defects = Vec::new();
    let stderr = &execution.stderr;
    if stderr.contains("panicked at") || stderr.contains("RUST_BACKTRACE") {
        defects.push(Defect::Panic);
    }
    let named = |culprits: &[String]| {
        culprits.is_empty() || culprits.iter().any(|c| stderr.contains(c.as_str()))
    };
    match (execution.ended, expect) {
        (Ended::Killed, _) => defects.push(Defect::Hang),
        (Ended::Signal(s), _) => defects.push(Defect::Signal(s)),
        (Ended::Exited(0), Expect::Error(_)) => defects.push(Defect::AcceptedSilently),
        (Ended::Exited(0), _) => {}
        (Ended::Exited(1), Expect::Accepted) => defects.push(Defect::Refused),
        (Ended::Exited(1), Expect::Error(c) | Expect::Either(c)) if !named(c) => {
            defects.push(Defect::NamesNothing(c.clone()))
        }
        (Ended::Exited(1), _) => {}
        (Ended::Exited(code), _) => defects.push(Defect::Status(code)),
    }
    if !lost.is_empty() {
        defects.push(Defect::FilesLost(lost));
    }
    defects
}

/// The verdicts of a run of cases.
#[derive(Clone, Debug)]
pub struct Verdicts {
    verdicts: Vec<Verdict>,
    deadline: Duration,
}

impl Verdicts {
    /// Every verdict, in the cases' order.
    pub fn all(&self) -> &[Verdict] {
        &self.verdicts
    }

    /// The failing verdicts.
    pub fn failing(&self) -> impl Iterator<Item = &Verdict> {
        self.verdicts.iter().filter(|v| !v.defects.is_empty())
    }

    /// Prints the summary; returns the number of cases when every case was fine, and panics
    /// with every failing case, grouped by the kind of its first defect, otherwise.
    pub fn finish(self) -> usize {
        eprintln!("{}", self.summary());
        let failing: Vec<&Verdict> = self.failing().collect();
        if failing.is_empty() {
            eprintln!("all {} cases fine", self.verdicts.len());
            return self.verdicts.len();
        }
        let mut groups: BTreeMap<&Defect, Vec<&Verdict>> = BTreeMap::new();
        for v in &failing {
            groups.entry(&v.defects[0]).or_default().push(v);
        }
        // One heading per kind (the map is keyed by the whole defect; merge by kind).
        let mut by_kind: Vec<(&str, Vec<&Verdict>)> = Vec::new();
        for (defect, verdicts) in groups {
            match by_kind.iter_mut().find(|(k, _)| *k == defect.kind()) {
                Some((_, list)) => list.extend(verdicts),
                None => by_kind.push((defect.kind(), verdicts)),
            }
        }
        let mut report = format!(
            "{} of {} cases not fine (deadline {:?}):\n",
            failing.len(),
            self.verdicts.len(),
            self.deadline
        );
        for (kind, verdicts) in by_kind {
            let _ = writeln!(report, "\n== {kind} ({}) ==", verdicts.len());
            for v in verdicts {
                let details: Vec<String> = v.defects.iter().map(Defect::detail).collect();
                let _ = writeln!(
                    report,
                    "- [{}] {} — {}\n    stderr: {}",
                    v.group,
                    v.label,
                    details.join(" + "),
                    v.last_line()
                );
            }
        }
        panic!("{report}");
    }

    /// One line per case: its group and label, how it ended, its peak memory and the last line
    /// of its stderr (what a reader checks a message against).
    pub fn transcript(&self) -> String {
        let mut text = String::new();
        for v in &self.verdicts {
            let (ended, mib) = v
                .execution
                .as_ref()
                .map_or(("not run".to_string(), 0), |e| {
                    (format!("{:?}", e.ended), e.peak_rss_kib / 1024)
                });
            let verdict = if v.defects.is_empty() {
                "fine"
            } else {
                "NOT FINE"
            };
            let _ = writeln!(
                text,
                "[{}] {} — {verdict}, {ended}, {mib} MiB\n    {}",
                v.group,
                v.label,
                v.last_line()
            );
        }
        text
    }

    /// The case count per group, the worst accepted input's peak memory and the slowest cases.
    pub fn summary(&self) -> String {
        let mut groups: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for v in &self.verdicts {
            let entry = groups.entry(&v.group).or_default();
            entry.0 += 1;
            entry.1 += usize::from(!v.defects.is_empty());
        }
        let mut text = format!("{} cases:\n", self.verdicts.len());
        for (group, (n, bad)) in groups {
            let _ = writeln!(text, "  {group:<24} {n:>4} cases, {bad:>3} not fine");
        }
        let ran = || {
            self.verdicts
                .iter()
                .filter_map(|v| Some((v, v.execution.as_ref()?)))
        };
        let accepted = ran()
            .filter(|(_, e)| e.ended == Ended::Exited(0))
            .max_by_key(|(_, e)| e.peak_rss_kib);
        if let Some((v, e)) = accepted {
            let _ = writeln!(
                text,
                "peak resident memory of the worst accepted input: {} MiB ({}: {})",
                e.peak_rss_kib / 1024,
                v.group,
                v.label
            );
        }
        if let Some((v, e)) = ran().max_by_key(|(_, e)| e.peak_rss_kib) {
            let _ = writeln!(
                text,
                "peak resident memory of any input: {} MiB ({}: {})",
                e.peak_rss_kib / 1024,
                v.group,
                v.label
            );
        }
        let mut slow: Vec<_> = ran().collect();
        slow.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
        for (v, e) in slow.iter().take(3) {
            let _ = writeln!(text, "slow: {:.1} s ({}: {})", e.seconds, v.group, v.label);
        }
        text
    }
}

/// One entry of a folder tree, as compared before and after a case.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    Dir,
    File { len: u64, sha256: [u8; 32] },
    Symlink(PathBuf),
    Fifo,
    Other,
    Unreadable(String),
}

/// Every entry under a folder (symbolic links not followed, FIFOs not opened), by path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<PathBuf, Entry>);

impl Snapshot {
    /// The entries under `root` (itself included) for which `watched` holds; an absent root
    /// has none.
    pub fn of(root: &Path, watched: &dyn Fn(&Path) -> bool) -> Self {
        let mut entries = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(path) = stack.pop() {
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let kind = meta.file_type();
            let entry = if kind.is_dir() {
                match fs::read_dir(&path) {
                    Ok(children) => {
                        stack.extend(children.filter_map(|c| c.ok().map(|c| c.path())));
                        Entry::Dir
                    }
                    Err(e) => Entry::Unreadable(e.to_string()),
                }
            } else if kind.is_symlink() {
                fs::read_link(&path)
                    .map_or_else(|e| Entry::Unreadable(e.to_string()), Entry::Symlink)
            } else if kind.is_file() {
                hash(&path).unwrap_or_else(|e| Entry::Unreadable(e.to_string()))
            } else if is_fifo(&kind) {
                Entry::Fifo
            } else {
                Entry::Other
            };
            if watched(&path) {
                entries.insert(path, entry);
            }
        }
        Self(entries)
    }

    /// The entries of `self` that `after` lacks or holds differently, one line each.
    pub fn changes(&self, after: &Snapshot) -> Vec<String> {
        let mut lines = Vec::new();
        for (path, entry) in &self.0 {
            match after.0.get(path) {
                None => lines.push(format!("{} removed", path.display())),
                Some(now) if now != entry => lines.push(format!(
                    "{} changed ({} → {})",
                    path.display(),
                    describe(entry),
                    describe(now)
                )),
                Some(_) => {}
            }
        }
        // The first lines say enough; a wiped folder would list every file.
        if lines.len() > 4 {
            let more = lines.len() - 3;
            lines.truncate(3);
            lines.push(format!("… and {more} more"));
        }
        lines
    }
}

fn describe(entry: &Entry) -> String {
    match entry {
        Entry::Dir => "folder".into(),
        Entry::File { len, .. } => format!("file of {len} bytes"),
        Entry::Symlink(target) => format!("link to {}", target.display()),
        Entry::Fifo => "FIFO".into(),
        Entry::Other => "special file".into(),
        Entry::Unreadable(why) => format!("unreadable: {why}"),
    }
}

fn is_fifo(kind: &fs::FileType) -> bool {
    use std::os::unix::fs::FileTypeExt;
    kind.is_fifo()
}

fn hash(path: &Path) -> std::io::Result<Entry> {
    let mut file = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let len = std::io::copy(&mut file, &mut hasher)?;
    Ok(Entry::File {
        len,
        sha256: hasher.finalize().into(),
    })
}

/// Makes a FIFO at `path` (with `mkfifo`; a reader that opens it blocks until a writer comes,
/// which none does).
pub fn fifo(path: &Path) -> std::io::Result<()> {
    let status = Command::new("mkfifo").arg(path).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "mkfifo {}: {status}",
            path.display()
        )))
    }
}

/// Makes `path` a symbolic link to itself: opening it fails with "too many levels of symbolic
/// links" (ELOOP).
pub fn symlink_loop(path: &Path) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} has no file name", path.display())))?;
    std::os::unix::fs::symlink(name, path)
}

/// The bytes of a PNG file: the signature, an `IHDR` chunk of `width`, `height`, `bit_depth`
/// and `colour_type` (compression, filter and interlace 0, whatever the values: a hostile
/// header is the point), the `extra` chunks (e.g. a `PLTE`), one `IDAT` chunk holding `idat`
/// (a zlib stream of filtered scanlines: [`zlib`], [`zlib_zeros`]) and `IEND`.
pub fn png_bytes(
    (width, height): (u32, u32),
    bit_depth: u8,
    colour_type: u8,
    extra: &[([u8; 4], Vec<u8>)],
    idat: &[u8],
) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[bit_depth, colour_type, 0, 0, 0]);
    png_chunk(&mut bytes, *b"IHDR", &ihdr);
    for (kind, data) in extra {
        png_chunk(&mut bytes, *kind, data);
    }
    png_chunk(&mut bytes, *b"IDAT", idat);
    png_chunk(&mut bytes, *b"IEND", &[]);
    bytes
}

/// Appends one PNG chunk: length, type, data, CRC-32 of type and data.
fn png_chunk(out: &mut Vec<u8>, kind: [u8; 4], data: &[u8]) {
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&crc32(kind.iter().chain(data)).to_be_bytes());
}

/// The CRC-32 of PNG and zlib (reflected polynomial 0xEDB88320), bit by bit.
fn crc32<'a>(bytes: impl Iterator<Item = &'a u8>) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// `bytes` as a zlib stream.
pub fn zlib(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(bytes);
    encoder.finish().unwrap_or_default()
}

/// A zlib stream of `len` zero bytes, compressed as tightly as deflate allows (about 1000:1),
/// written a megabyte at a time: an inflate bomb of `len` bytes costs `len`/1000 bytes of
/// memory and disk.
pub fn zlib_zeros(len: u64) -> Vec<u8> {
    const BLOCK: usize = 1 << 20;
    let zeros = vec![0u8; BLOCK];
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let mut left = len;
    while left > 0 {
        let n = usize::try_from(left).map_or(BLOCK, |l| l.min(BLOCK));
        let _ = encoder.write_all(&zeros[..n]);
        left -= n as u64;
    }
    encoder.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("kappa-cli-cases-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("case")).unwrap();
        dir
    }

    /// A case of `sh -c script` in its own folder `dir/<n>`, which holds `kept.txt` and
    /// `out/{user,old}.txt`.
    fn sh(dir: &Path, n: usize, script: &str) -> Case {
        let case = dir.join(n.to_string());
        fs::create_dir_all(case.join("out")).unwrap();
        fs::write(case.join("kept.txt"), "mine").unwrap();
        fs::write(case.join("out/user.txt"), "user").unwrap();
        fs::write(case.join("out/old.txt"), "old").unwrap();
        Case::new("sh", script, case).args(["-c", script])
    }

    #[test]
    fn the_runner_tells_each_kind_of_defect_apart() {
        let dir = scratch("kinds");
        let out = |n: usize| dir.join(n.to_string()).join("out");
        let cases = vec![
            sh(&dir, 0, "echo 'error: job.toml: train.lr' >&2; exit 1").error(["train.lr"]),
            sh(&dir, 1, "echo 'error: invalid value' >&2; exit 1").error(["train.lr"]),
            sh(&dir, 2, "exit 0").error(["train.lr"]),
            sh(&dir, 3, "exit 1").accepted(),
            sh(
                &dir,
                4,
                "echo \"thread 'main' panicked at src/x.rs\" >&2; exit 1",
            )
            .error([""]),
            sh(&dir, 5, "kill -ABRT $$").accepted(),
            sh(&dir, 6, "exit 2").accepted(),
            sh(&dir, 7, "exec sleep 3600").accepted(),
            sh(&dir, 8, "rm kept.txt").accepted(),
            sh(&dir, 9, "rm out/old.txt; echo new > out/new.txt")
                .accepted()
                .output(out(9)),
            sh(&dir, 10, "rm out/user.txt")
                .accepted()
                .output(out(10))
                .keep(out(10).join("user.txt")),
            sh(&dir, 11, "exit 0").either(["x"]),
        ];
        let verdicts = Runner::new("sh", dir.join("logs"))
            .deadline(Duration::from_millis(1500))
            .workers(2)
            .run(cases);
        let kinds: Vec<Vec<Defect>> = verdicts.all().iter().map(|v| v.defects.clone()).collect();
        assert_eq!(kinds[0], vec![]);
        assert_eq!(
            kinds[1],
            vec![Defect::NamesNothing(vec!["train.lr".into()])]
        );
        assert_eq!(kinds[2], vec![Defect::AcceptedSilently]);
        assert_eq!(kinds[3], vec![Defect::Refused]);
        assert_eq!(kinds[4], vec![Defect::Panic]);
        assert_eq!(kinds[5], vec![Defect::Signal(6)]);
        assert_eq!(kinds[6], vec![Defect::Status(2)]);
        assert_eq!(kinds[7], vec![Defect::Hang]);
        let lost = |k: &[Defect], what: &str| matches!(k, [Defect::FilesLost(l)] if l.len() == 1 && l[0].ends_with(what));
        assert!(lost(&kinds[8], "kept.txt removed"), "{kinds:?}");
        assert_eq!(kinds[9], vec![]);
        assert!(lost(&kinds[10], "user.txt removed"), "{kinds:?}");
        assert_eq!(kinds[11], vec![]);
        let report = std::panic::catch_unwind(|| verdicts.finish()).unwrap_err();
        let report = report.downcast_ref::<String>().unwrap();
        assert!(report.contains("9 of 12 cases not fine"), "{report}");
        assert!(
            report.contains("== died of a signal (abort, crash) (1) =="),
            "{report}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_snapshot_sees_contents_types_and_link_targets() {
        let dir = scratch("snapshot");
        let case = dir.join("case");
        fs::write(case.join("a"), "1").unwrap();
        symlink_loop(&case.join("loop")).unwrap();
        fifo(&case.join("pipe")).unwrap();
        let all = |_: &Path| true;
        let before = Snapshot::of(&case, &all);
        assert_eq!(
            before.changes(&Snapshot::of(&case, &all)),
            Vec::<String>::new()
        );
        fs::write(case.join("a"), "2").unwrap();
        fs::remove_file(case.join("loop")).unwrap();
        std::os::unix::fs::symlink("a", case.join("loop")).unwrap();
        fs::remove_file(case.join("pipe")).unwrap();
        fs::create_dir(case.join("pipe")).unwrap();
        let changes = before.changes(&Snapshot::of(&case, &all));
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(changes.iter().all(|c| c.contains("changed")), "{changes:?}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn png_bytes_decode_as_the_header_says() {
        // A 2×1 gray image: each scanline is a filter byte (0) and the samples.
        let png = png_bytes((2, 1), 8, 0, &[], &zlib(&[0, 7, 9]));
        assert_eq!(&png[1..4], b"PNG");
        assert_eq!(&png[12..16], b"IHDR");
        // The CRC of an empty IEND chunk is the well-known AE 42 60 82.
        assert_eq!(&png[png.len() - 4..], &[0xAE, 0x42, 0x60, 0x82]);
        let zeros = zlib_zeros(10 << 20);
        assert!(zeros.len() < (10 << 20) / 500, "{} bytes", zeros.len());
        let mut inflated = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::ZlibDecoder::new(&zeros[..]),
            &mut inflated,
        )
        .unwrap();
        assert_eq!(inflated.len(), 10 << 20);
        assert!(inflated.iter().all(|&b| b == 0));
    }
}
