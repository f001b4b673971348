//! What both binaries of the command share: the flags every subcommand
//! takes, and `snapshot`, `restore` and `fork`: their arguments, their one
//! control request (as JSON, the control socket's format: a
//! `forkfs::service::Request`) and how its answer is shown. The `forkfs`
//! launcher (`src/main.rs`) sends those requests straight to the process
//! holding a store and links no store code, so nothing here may use the
//! forkfs library; `forkfs-core` (`src/core.rs`) runs them here or there.

use serde_json::{Value, json};
use std::path::PathBuf;

/// Flags every subcommand takes.
#[derive(clap::Args, Clone, Debug)]
pub struct Global {
    /// Store directory [default: $XDG_DATA_HOME/forkfs]
    #[arg(long, env = "FORKFS_STORE", global = true)]
    pub store: Option<PathBuf>,
    /// Machine-readable JSON output
    #[arg(long, global = true)]
    pub json: bool,
    /// Log verbosity (also RUST_LOG)
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

impl Global {
    pub fn store_dir(&self) -> PathBuf {
        self.store.clone().unwrap_or_else(crate::home::default_store_dir)
    }
}

#[derive(clap::Args)]
pub struct SnapshotArgs {
    /// The volume (or, with --group, nothing)
    #[arg(required_unless_present = "group")]
    pub volume: Option<String>,
    /// One version of every member of this volume group, at one cut
    #[arg(long, conflicts_with = "volume")]
    pub group: Option<String>,
    /// Name the version (named versions are never pruned)
    #[arg(long)]
    pub name: Option<String>,
    /// A free-text label
    #[arg(long, short)]
    pub message: Option<String>,
}

#[derive(clap::Args)]
pub struct ForkArgs {
    /// VOL (its current state) or VOL@VERSION; with --group, the new group's name
    pub source: String,
    /// Name of the new volume
    #[arg(required_unless_present = "group")]
    pub new: Option<String>,
    /// Fork every member of this volume group (GROUP: a new group
    /// snapshot; GROUP@VERSION: that group version) as NEW.MEMBER, in a
    /// new group NEW
    #[arg(long)]
    pub group: Option<String>,
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The volume; with --group, the group version (NAME, number or ~N)
    pub volume: String,
    /// A version of VOLUME (id, name or ~N), or OTHER@VERSION
    #[arg(required_unless_present = "group")]
    pub version: Option<String>,
    /// Restore every member of this volume group to its version in a
    /// group version
    #[arg(long)]
    pub group: Option<String>,
}

/// One of the three commands as its single control request; a group's
/// (several requests) is `forkfs-core`'s alone.
pub enum Held {
    Snapshot(Value),
    Fork(Value),
    Restore { volume: String, req: Value },
}

impl SnapshotArgs {
    /// The request, or `None` with `--group`.
    pub fn held(&self) -> anyhow::Result<Option<Held>> {
        Ok(match (&self.volume, &self.group) {
            (_, Some(_)) => None,
            (Some(v), None) => Some(Held::Snapshot(json!({
                "op": "snapshot", "volume": v, "name": self.name, "label": self.message,
            }))),
            (None, None) => anyhow::bail!("name a volume, or a group with --group"),
        })
    }
}

impl ForkArgs {
    /// The request, or `None` with `--group`.
    pub fn held(&self) -> anyhow::Result<Option<Held>> {
        Ok(match (&self.new, &self.group) {
            (None, Some(_)) => None,
            (Some(_), Some(_)) => anyhow::bail!("with --group, name only the new group"),
            (Some(n), None) => {
                Some(Held::Fork(json!({ "op": "fork", "source": self.source, "new": n })))
            }
            (None, None) => anyhow::bail!("name the new volume"),
        })
    }
}

impl RestoreArgs {
    /// The request, or `None` with `--group`.
    pub fn held(&self) -> anyhow::Result<Option<Held>> {
        Ok(match (&self.version, &self.group) {
            (None, Some(_)) => None,
            (Some(_), Some(_)) => anyhow::bail!("with --group, name only the group version"),
            (Some(v), None) => Some(Held::Restore {
                volume: self.volume.clone(),
                req: json!({ "op": "restore", "volume": self.volume, "version": v }),
            }),
            (None, None) => anyhow::bail!("name the version to restore"),
        })
    }
}

/// A field of an answer, or an error naming it.
fn field<'a>(v: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    v.get(name).ok_or_else(|| anyhow::anyhow!("the answer has no {name}"))
}

/// A field of an answer that is text.
fn text<'a>(v: &'a Value, name: &str) -> anyhow::Result<&'a str> {
    field(v, name)?.as_str().ok_or_else(|| anyhow::anyhow!("the answer's {name} is not text"))
}

/// A version (a `VersionRecord`) as people see it: VOLUME@ID, the id in
/// its short form (12 hex digits, as `VersionId::short`).
fn version(v: &Value) -> anyhow::Result<String> {
    let id = text(v, "id")?;
    Ok(format!("{}@{}", text(v, "volume_name")?, id.get(..12).unwrap_or(id)))
}

impl Held {
    pub fn request(&self) -> &Value {
        match self {
            Held::Snapshot(r) | Held::Fork(r) | Held::Restore { req: r, .. } => r,
        }
    }

    /// Prints the answer, for people or (`json`) for scripts.
    pub fn show(&self, json: bool, answer: Value) -> anyhow::Result<()> {
        let line = match self {
            Held::Snapshot(_) if json => return print_json(&answer),
            Held::Fork(_) if json => return print_json(field(&answer, "volume")?),
            Held::Restore { .. } if json => {
                let id = |k| field(field(&answer, k)?, "id");
                let restored = id("restored")?;
                return print_json(
                    &json!({ "restored": restored, "previous_head": id("previous_head")? }),
                );
            }
            Held::Snapshot(_) => version(&answer)?,
            Held::Fork(_) => {
                let from = version(field(&answer, "from")?)?;
                format!("forked {from} as {}", text(field(&answer, "volume")?, "name")?)
            }
            Held::Restore { volume, .. } => {
                let to = version(field(&answer, "restored")?)?;
                let to = to.rsplit('@').next().unwrap_or_default();
                let pre = version(field(&answer, "previous_head")?)?;
                format!(
                    "restored {volume} to {to}; the previous state is {pre} (restore that to undo)"
                )
            }
        };
        println!("{line}");
        Ok(())
    }
}

pub fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
