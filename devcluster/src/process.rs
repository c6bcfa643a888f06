//! Child processes that never outlive the control plane.
//!
//! Each component runs in its own process group, so stopping it signals everything it
//! started. Three layers make sure nothing is left behind:
//! 1. `Drop` stops the group (SIGTERM, a grace period, then SIGKILL); this covers normal
//!    returns and panics that unwind.
//! 2. A guard process (bash, in its own group) holds the read end of a pipe and knows every
//!    live group. If this process dies without unwinding (SIGKILL, SIGTERM's default
//!    action, abort), the pipe closes and the guard ends the groups.
//! 3. Each group is recorded in the state folder; the next start on that folder ends
//!    whatever is still running from a previous run.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::Error;

/// How long a component gets to exit after SIGTERM before SIGKILL.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

const GUARD_SCRIPT: &str = r#"
trap '' INT TERM HUP
declare -A groups
while read -r line; do
  case "$line" in
    +*) groups[${line#+}]=1 ;;
    -*) unset "groups[${line#-}]" ;;
  esac
done
((${#groups[@]})) || exit 0
for g in "${!groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
for _ in $(seq 50); do
  alive=0
  for g in "${!groups[@]}"; do kill -0 -- "-$g" 2>/dev/null && alive=1; done
  ((alive)) || exit 0
  sleep 0.1
done
for g in "${!groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
"#;

/// The guard process of layer 2. Dropping it (closing the pipe) makes it end every group
/// still registered.
#[derive(Debug)]
pub(crate) struct Guard {
    stdin: Mutex<Option<ChildStdin>>,
    child: Mutex<Child>,
}

impl Guard {
    pub fn spawn() -> Result<Guard, Error> {
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(GUARD_SCRIPT)
            .arg("devcluster-guard")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(Error::io("starting the devcluster guard process (bash)"))?;
        let stdin = child.stdin.take();
        Ok(Guard {
            stdin: Mutex::new(stdin),
            child: Mutex::new(child),
        })
    }

    fn send(&self, line: String) {
        if let Ok(mut stdin) = self.stdin.lock()
            && let Some(pipe) = stdin.as_mut()
        {
            // A dead guard cannot be helped here; layers 1 and 3 still apply.
            let _ = writeln!(pipe, "{line}");
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.lock().ok().map(|c| c.id())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(mut stdin) = self.stdin.lock() {
            stdin.take();
        }
        if let Ok(mut child) = self.child.lock() {
            let _ = child.wait();
        }
    }
}

/// One component (etcd, kube-apiserver, …) running in its own process group, with its
/// output in `<state>/logs/<name>.log`.
#[derive(Debug)]
pub(crate) struct Supervised {
    name: String,
    child: Child,
    log: PathBuf,
    pid_file: PathBuf,
}

impl Supervised {
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        state_dir: &Path,
        guard: &Guard,
    ) -> Result<Supervised, Error> {
        let logs = state_dir.join("logs");
        let pids = state_dir.join("pids");
        for d in [&logs, &pids] {
            std::fs::create_dir_all(d).map_err(Error::io(format!("creating {}", d.display())))?;
        }
        let log = logs.join(format!("{name}.log"));
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(Error::io(format!("starting {name} ({program})")))?;
        guard.send(format!("+{}", child.id()));
        let pid_file = pids.join(name);
        // "<pgid> <program>": the program lets a later start check that the pid still
        // belongs to what we started before it signals anything.
        std::fs::write(&pid_file, format!("{} {}\n", child.id(), program))
            .map_err(Error::io(format!("writing {}", pid_file.display())))?;
        Ok(Supervised {
            name: name.to_owned(),
            child,
            log,
            pid_file,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// The early-exit error for this component, with the end of its log.
    pub fn exited_error(&self, status: String) -> Error {
        Error::ExitedEarly {
            component: self.name.clone(),
            status,
            log: self.log.clone(),
            tail: log_tail(&self.log, 25),
        }
    }

    /// SIGTERM to the group, SIGKILL after `grace`, then reap. Idempotent.
    pub fn stop(&mut self, guard: &Guard, grace: Duration) {
        let pgid = self.child.id();
        stop_group(pgid, grace, || matches!(self.child.try_wait(), Ok(Some(_))));
        let _ = self.child.wait();
        guard.send(format!("-{pgid}"));
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Signals group `pgid` with SIGTERM, waits until `gone()` says the leader has exited
/// or SIGKILLs the group when `grace` passes first. (No SIGKILL after a clean exit: once
/// the leader is reaped its group id may be reused.)
fn stop_group(pgid: u32, grace: Duration, mut gone: impl FnMut() -> bool) {
    let Ok(raw) = i32::try_from(pgid) else {
        return;
    };
    let group = Pid::from_raw(raw);
    if killpg(group, Signal::SIGTERM).is_err() {
        return; // the group is already gone
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if gone() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = killpg(group, Signal::SIGKILL);
}

/// Ends the process groups recorded in `<state>/pids` by an earlier run that did not
/// clean up (layer 3). A pid is only signalled while /proc says it still runs the
/// program that was recorded, so a recycled pid is left alone.
pub fn end_stale(state_dir: &Path) -> Vec<String> {
    let mut ended = Vec::new();
    let Ok(entries) = std::fs::read_dir(state_dir.join("pids")) else {
        return ended;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let mut parts = text.trim().splitn(2, ' ');
        let (Some(pid), Some(program)) = (parts.next(), parts.next()) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        if let Ok(pid) = pid.parse::<u32>()
            && runs_program(pid, program)
        {
            stop_group(pid, GRACE, || !is_alive(pid));
            ended.push(format!(
                "{} (pid {pid})",
                entry.file_name().to_string_lossy()
            ));
        }
        let _ = std::fs::remove_file(&path);
    }
    ended
}

fn runs_program(pid: u32, program: &str) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => cmdline
            .split(|b| *b == 0)
            .next()
            .is_some_and(|argv0| argv0 == program.as_bytes()),
        Err(_) => false,
    }
}

/// Whether a process with this pid exists (zombies count as gone).
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 is the state; after the ")" that ends the command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The last `n` lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read log: {e})"),
    }
}
