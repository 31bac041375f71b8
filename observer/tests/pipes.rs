//! A closed pipe ends every command quietly with exit status 0, on stdout
//! and on stderr alike (`observer ... | head`, `observer ... 2>&1 | head`):
//! the built binary's `attach` and `diagnose` on `lo` of a namespace of
//! their own, `replay` of the reference captures, and `lab`, which must
//! also remove everything it created on the way out.
//!
//! A stream is closed either at once (the observer starts with a pipe
//! whose reader is gone: its first write to it fails) or once a given
//! line was read from it. The observer writes to stderr only now and
//! then, so after closing stderr mid-run the test makes it write: SIGHUP
//! logs "settings reloaded".

mod support;

use std::{
    io::{BufRead, BufReader, Read},
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    thread::JoinHandle,
};

use support::{
    lab::leftovers,
    netns::{Netns, ObserverProcess, WAIT, scaled, signal, wait_timeout},
};

/// The stream the test closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
    /// Both on one pipe, as `2>&1 | head`.
    Both,
}

/// When the test closes it.
#[derive(Debug, Clone, Copy)]
enum When {
    /// Before the observer runs.
    AtOnce,
    /// Once a line containing this was read.
    AfterLine(&'static str),
}

/// What a run with a closed stream did.
struct Closed {
    status: ExitStatus,
    /// Everything read, from both streams.
    read: String,
}

impl Closed {
    /// Exit status 0, no panic and no error message.
    fn assert_quiet(&self, what: &str) {
        assert_eq!(
            self.status.code(),
            Some(0),
            "{what}: exit status {}; read:\n{}",
            self.status,
            self.read
        );
        for bad in ["panicked", "observer: error"] {
            assert!(
                !self.read.contains(bad),
                "{what}: {bad:?} in what was read:\n{}",
                self.read
            );
        }
    }
}

/// The observer process, killed when a test fails before it exits.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Reads `pipe` to its end on a thread.
fn read_to_end(pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(pipe).read_to_string(&mut text);
        text
    })
}

/// Runs `command` with `stream` closed `when`; once closed mid-run,
/// `then(pid)`. The other stream is read to its end.
fn run_closing(mut command: Command, stream: Stream, when: When, then: impl FnOnce(u32)) -> Closed {
    command.stdin(Stdio::null());
    let (reader, writer) = std::io::pipe().expect("pipe");
    let (closing, other) = match stream {
        Stream::Stdout => (Stdio::from(writer), Stdio::piped()),
        Stream::Stderr => (Stdio::from(writer), Stdio::piped()),
        Stream::Both => {
            let second = writer.try_clone().expect("dup");
            (Stdio::from(writer), Stdio::from(second))
        }
    };
    match stream {
        Stream::Stdout | Stream::Both => command.stdout(closing).stderr(other),
        Stream::Stderr => command.stderr(closing).stdout(other),
    };
    let mut reader = Some(reader);
    if matches!(when, When::AtOnce) {
        reader = None;
    }
    let mut child = Running(command.spawn().expect("spawning the observer"));
    // Our copies of the write ends went with `command`'s Stdio: drop it
    // so that the pipes end when the observer exits.
    drop(command);
    let other = match stream {
        Stream::Stdout => Some(read_to_end(child.0.stderr.take().unwrap())),
        Stream::Stderr => Some(read_to_end(child.0.stdout.take().unwrap())),
        Stream::Both => None,
    };
    let mut read = String::new();
    if let (Some(pipe), When::AfterLine(marker)) = (reader.take(), when) {
        let mut lines = BufReader::new(pipe);
        loop {
            let mut line = String::new();
            let n = lines.read_line(&mut line).expect("reading the observer");
            read.push_str(&line);
            if n == 0 || line.contains(marker) {
                assert!(n > 0, "no line with {marker:?}; read:\n{read}");
                break;
            }
        }
        // Closes the read end.
        drop(lines);
        then(child.0.id());
    }
    let status = wait_timeout(&mut child.0, scaled(WAIT)).unwrap_or_else(|| {
        panic!(
            "the observer did not exit within {:?} with {stream:?} closed; read:\n{read}",
            scaled(WAIT)
        )
    });
    if let Some(other) = other {
        read.push_str(&other.join().unwrap());
    }
    Closed { status, read }
}

/// `observer SUBCOMMAND --netns NS --interval 200ms --duration 3s ARGS... lo`.
fn observer_on_lo(ns: &Netns, subcommand: &str, args: &[&str]) -> Command {
    let mut command = Command::new(ObserverProcess::binary());
    command
        .arg(subcommand)
        .args([
            "--netns",
            ns.name(),
            "--interval",
            "200ms",
            "--duration",
            "3s",
        ])
        .args(args)
        .arg("lo")
        .env("OBSERVER_LOG", "info");
    command
}

/// SIGHUP: the observer logs "settings reloaded" on stderr.
fn hangup(pid: u32) {
    signal(pid, libc::SIGHUP);
}

/// `observer SUBCOMMAND --output json` on `lo` with stdout closed after
/// its first JSON line.
fn stdout_closed_after_the_first_line(subcommand: &str, tag: &str) {
    let ns = Netns::new(tag);
    let command = observer_on_lo(&ns, subcommand, &["--output", "json"]);
    run_closing(
        command,
        Stream::Stdout,
        When::AfterLine(r#""type":"attach""#),
        drop,
    )
    .assert_quiet(&format!("{subcommand}, stdout closed"));
}

/// `observer SUBCOMMAND --output json` on `lo` with stderr closed after
/// "attached" (which comes after the signal handlers are in), then made
/// to log; the run goes on to its end and prints `last`.
fn stderr_closed_after_the_first_line(subcommand: &str, tag: &str, last: &str) {
    let ns = Netns::new(tag);
    let command = observer_on_lo(&ns, subcommand, &["--output", "json"]);
    let closed = run_closing(command, Stream::Stderr, When::AfterLine("attached"), hangup);
    closed.assert_quiet(&format!("{subcommand}, stderr closed"));
    assert!(
        closed.read.contains(last),
        "{subcommand}: no {last} line after stderr closed:\n{}",
        closed.read
    );
}

#[test]
fn attach_with_stdout_closed_after_the_first_line_exits_0() {
    if support::have_root("attach_with_stdout_closed_after_the_first_line_exits_0") {
        stdout_closed_after_the_first_line("attach", "ppa");
    }
}

#[test]
fn attach_with_stderr_closed_after_the_first_line_exits_0() {
    if support::have_root("attach_with_stderr_closed_after_the_first_line_exits_0") {
        stderr_closed_after_the_first_line("attach", "ppb", r#""final":true"#);
    }
}

#[test]
fn diagnose_with_stdout_closed_after_the_first_line_exits_0() {
    if support::have_root("diagnose_with_stdout_closed_after_the_first_line_exits_0") {
        stdout_closed_after_the_first_line("diagnose", "ppe");
    }
}

#[test]
fn diagnose_with_stderr_closed_after_the_first_line_exits_0() {
    if support::have_root("diagnose_with_stderr_closed_after_the_first_line_exits_0") {
        stderr_closed_after_the_first_line("diagnose", "ppf", r#""type":"diagnosis""#);
    }
}

#[test]
fn attach_with_stdout_and_stderr_on_a_closed_pipe_exits_0() {
    if !support::have_root("attach_with_stdout_and_stderr_on_a_closed_pipe_exits_0") {
        return;
    }
    let ns = Netns::new("ppc");
    // The first write is the "attached" log line, then the attach line.
    let command = observer_on_lo(&ns, "attach", &["--output", "json"]);
    run_closing(command, Stream::Both, When::AtOnce, drop)
        .assert_quiet("attach, 2>&1 into a closed pipe");
}

#[test]
fn attach_into_head_exits_0() {
    if !support::have_root("attach_into_head_exits_0") {
        return;
    }
    let ns = Netns::new("ppd");
    for lines in ["1", "2", "3", "4"] {
        into_head(
            lines,
            &[
                "attach",
                "--netns",
                ns.name(),
                "--interval",
                "200ms",
                "--duration",
                "3s",
                "lo",
            ],
        )
        .assert_quiet(&format!("attach 2>&1 | head -{lines}"));
    }
}

#[test]
fn diagnose_write_up_into_a_closed_pipe_exits_0() {
    if !support::have_root("diagnose_write_up_into_a_closed_pipe_exits_0") {
        return;
    }
    let ns = Netns::new("ppg");
    // Not on a terminal: nothing on stdout before the write-up.
    let command = observer_on_lo(&ns, "diagnose", &[]);
    run_closing(command, Stream::Both, When::AtOnce, drop)
        .assert_quiet("diagnose, 2>&1 into a closed pipe");
}

/// `ip netns exec NS observer replay --output json CAPTURES...`.
fn replay(ns: &Netns, captures: &[PathBuf]) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", ns.name(), ObserverProcess::binary()])
        .args(["replay", "--output", "json"])
        .args(captures)
        .env("OBSERVER_LOG", "info");
    command
}

#[test]
fn replay_with_stdout_closed_exits_0() {
    if !support::have_root("replay_with_stdout_closed_exits_0") {
        return;
    }
    let captures = support::reference_captures();
    let ns = Netns::new("pph");
    run_closing(replay(&ns, &captures), Stream::Stdout, When::AtOnce, drop)
        .assert_quiet("replay, stdout closed");
}

#[test]
fn replay_with_stderr_closed_exits_0() {
    if !support::have_root("replay_with_stderr_closed_exits_0") {
        return;
    }
    let captures = support::reference_captures();
    let ns = Netns::new("ppi");
    let closed = run_closing(replay(&ns, &captures), Stream::Stderr, When::AtOnce, drop);
    closed.assert_quiet("replay, stderr closed");
    assert!(
        closed.read.contains(r#""final":true"#),
        "no final stats line:\n{}",
        closed.read
    );
}

#[test]
fn replay_into_head_exits_0() {
    if !support::have_root("replay_into_head_exits_0") {
        return;
    }
    let captures = support::reference_captures();
    let ns = Netns::new("ppj");
    let mut args = vec!["netns", "exec", ns.name(), ObserverProcess::binary()];
    args.extend(["replay", "--output", "json"]);
    args.extend(captures.iter().map(|p| p.to_str().unwrap()));
    let mut command = vec!["ip"];
    command.extend(args);
    into_head_argv("3", &command).assert_quiet("replay 2>&1 | head -3");
}

#[test]
fn lab_into_head_exits_0() {
    if !support::have_root("lab_into_head_exits_0") {
        return;
    }
    // Text: the three notes up to "observers starting" fill head; the next
    // line comes once the observers attached and the pings started, so
    // the closed stdout ends a lab with every kind of thing to remove.
    // The run ends there, long before --duration.
    let attach_timeout = format!("{}s", scaled(std::time::Duration::from_secs(60)).as_secs());
    let closed = into_head(
        "3",
        &[
            "lab",
            "--duration",
            "8s",
            "--attach-timeout",
            &attach_timeout,
        ],
    );
    closed.assert_quiet("lab 2>&1 | head -3");
    // The second note names the namespaces: obslab-<pid>-gpu (gpu ...).
    let pid: u32 = closed
        .read
        .split("obslab-")
        .nth(1)
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no lab namespace named in:\n{}", closed.read));
    let left = leftovers(pid);
    assert!(
        left.is_empty(),
        "left by the lab whose stdout closed: {left:?}"
    );
}

/// `observer ARGS... 2>&1 | head -LINES` in bash with pipefail: the status
/// is the observer's unless it is 0.
fn into_head(lines: &str, args: &[&str]) -> Closed {
    let mut argv = vec![ObserverProcess::binary()];
    argv.extend_from_slice(args);
    into_head_argv(lines, &argv)
}

fn into_head_argv(lines: &str, argv: &[&str]) -> Closed {
    let output = Command::new("bash")
        .arg("-c")
        .arg(format!(r#"set -o pipefail; "$@" 2>&1 | head -{lines}"#))
        .arg("bash")
        .args(argv)
        .env("OBSERVER_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .expect("running bash");
    Closed {
        status: output.status,
        read: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}
