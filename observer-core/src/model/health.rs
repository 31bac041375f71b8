//! `observer health`'s judgement, for probes that have no shell: is the
//! observer that writes this textfile alive (file recent) and attached
//! (programs attached)? Pure: the file's age and values come in.

use std::time::Duration;

/// What the probe read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// How long ago the file was last written.
    pub age: Duration,
    /// `observer_programs_attached`, when the file has it.
    pub programs_attached: Option<f64>,
}

/// Why the observer is not healthy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unhealthy {
    /// The file is older than allowed.
    #[error(
        "written {} ago, more than --max-age {}: the observer stopped updating it (stuck, or not running)",
        humantime::format_duration(Duration::from_secs(age.as_secs())),
        humantime::format_duration(*max_age)
    )]
    Stale {
        /// Its age.
        age: Duration,
        /// The limit.
        max_age: Duration,
    },
    /// No program is attached.
    #[error("observer_programs_attached is 0: the programs are detached (interfaces gone?)")]
    Detached,
    /// The file is not the observer's.
    #[error("no observer_programs_attached in it: not an observer textfile")]
    NotObserver,
}

/// Healthy when the file is at most `max_age` old and programs are
/// attached.
pub fn judge(reading: Reading, max_age: Duration) -> Result<(), Unhealthy> {
    if reading.age > max_age {
        return Err(Unhealthy::Stale {
            age: reading.age,
            max_age,
        });
    }
    match reading.programs_attached {
        None => Err(Unhealthy::NotObserver),
        Some(n) if n < 1.0 => Err(Unhealthy::Detached),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(120);

    fn reading(age_s: u64, attached: Option<f64>) -> Reading {
        Reading {
            age: Duration::from_secs(age_s),
            programs_attached: attached,
        }
    }

    #[test]
    fn fresh_and_attached_is_healthy_and_each_failure_is_named() {
        assert_eq!(judge(reading(5, Some(3.0)), MAX), Ok(()));
        assert_eq!(
            judge(reading(121, Some(3.0)), MAX).unwrap_err().to_string(),
            "written 2m 1s ago, more than --max-age 2m: the observer stopped updating it (stuck, or not running)"
        );
        assert_eq!(judge(reading(5, Some(0.0)), MAX), Err(Unhealthy::Detached));
        assert_eq!(judge(reading(5, None), MAX), Err(Unhealthy::NotObserver));
    }
}
