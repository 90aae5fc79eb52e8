//! What an operator deploys with: the config file and `--check-config`, the example settings,
//! the systemd unit and the container recipe, checked against the binary they run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `capstan ARGS` with no CAPSTAN_* variable of the test's own environment.
fn capstan(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
    for (name, _) in std::env::vars() {
        if name.starts_with("CAPSTAN_") || name.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    command.args(args).envs(env.iter().copied()).output().expect("run capstan")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `--check-config`'s settings: `key -> (value, source)`.
fn settings(output: &Output) -> std::collections::BTreeMap<String, (String, String)> {
    text(&output.stdout)
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| {
            let (key, rest) = line.split_once(" = ").expect("key = value");
            let (value, source) = rest.rsplit_once("  # ").expect("a source");
            (key.to_string(), (value.trim_matches('"').to_string(), source.to_string()))
        })
        .collect()
}

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "capstan.toml",
        "listen = \"127.0.0.1:7001\"\nworkflow_task_lease_seconds = 30\nactivity_task_lease_seconds = 90\nduty_lease_seconds = 12\n",
    );
    let output = capstan(
        &["serve", "--config", &file, "--check-config", "--activity-task-lease-seconds", "120"],
        &[("CAPSTAN_DUTY_LEASE_SECONDS", "15")],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let parsed = settings(&output);
    let get = |key: &str| parsed[key].clone();
    assert_eq!(get("listen"), ("127.0.0.1:7001".into(), "config file".into()));
    assert_eq!(get("workflow_task_lease_seconds"), ("30".into(), "config file".into()));
    assert_eq!(get("activity_task_lease_seconds"), ("120".into(), "flag".into()));
    assert_eq!(get("duty_lease_seconds"), ("15".into(), "environment".into()));
    assert_eq!(get("history_cache_mib"), ("32".into(), "default".into()));
    // The same file through CAPSTAN_CONFIG.
    let output = capstan(&["serve", "--check-config"], &[("CAPSTAN_CONFIG", &file)]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(settings(&output)["listen"].1, "config file");
}

#[test]
fn a_bad_file_is_refused_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    for (contents, expected) in [
        ("lisen = \"127.0.0.1:1\"\n", "unknown setting `lisen`"),
        ("check_config = \"yes\"\n", "unknown setting `check_config`"),
        ("workflow_task_lease_seconds = 0\n", "0 is not in 1..=3600"),
        ("auth = \"kerberos\"\n", "invalid value 'kerberos'"),
        (
            "listen = [\"a\"]\n",
            "`listen` must be a string, an integer or a boolean, not array",
        ),
        ("allow_unauthenticated_network = \"maybe\"\n", "invalid value 'maybe'"),
        ("listen = \n", "--config"),
        ("database = \"mysqll://u:secret@h/db\"\n", "unknown scheme \"mysqll\""),
    ] {
        let file = write(dir.path(), "bad.toml", contents);
        let output = capstan(&["serve", "--config", &file, "--check-config"], &[]);
        assert_eq!(output.status.code(), Some(2), "{contents:?} is refused");
        let message = text(&output.stderr);
        assert!(message.contains(expected), "{contents:?}: {message}");
        assert!(!message.contains("secret"), "a password is never echoed: {message}");
    }
    // Token auth with no token and no file is for a database that holds an admin's credential:
    // the check cannot see the database, so it says what serve will require.
    let file = write(dir.path(), "stored.toml", "auth = \"token\"\n");
    let output = capstan(&["serve", "--config", &file, "--check-config"], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("serve starts only if the database holds such an admin"));
    let output = capstan(&["serve", "--config", "/no/such/capstan.toml", "--check-config"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("/no/such/capstan.toml"));
}

#[test]
fn check_config_masks_secrets() {
    let output = capstan(
        &[
            "serve",
            "--check-config",
            "--auth",
            "token",
            "--database",
            "postgres://capstan:hunter2@db/capstan",
        ],
        &[("CAPSTAN_OPERATOR_TOKEN", "op-secret")],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = text(&output.stdout);
    assert!(!printed.contains("hunter2") && !printed.contains("op-secret"), "{printed}");
    assert_eq!(settings(&output)["operator_token"], ("***".into(), "environment".into()));
}

#[test]
fn the_example_file_names_every_setting_and_is_accepted() {
    let example = repository().join("deploy/capstan.toml");
    let output = capstan(&["serve", "--config", example.to_str().unwrap(), "--check-config"], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let contents = std::fs::read_to_string(&example).unwrap();
    let printed = text(&output.stdout);
    let keys = printed
        .lines()
        .map(|line| line.trim_start_matches("# ").split(' ').next().unwrap().to_string());
    for key in keys {
        let named = contents
            .lines()
            .any(|line| line.trim_start_matches("# ").starts_with(&format!("{key} = ")));
        assert!(named, "deploy/capstan.toml shows `{key}`");
    }
}

/// The unit's command lines, checked by the binary they run (with the example settings).
#[test]
fn the_systemd_unit_runs_a_valid_command_and_passes_systemd_analyze() {
    let unit = std::fs::read_to_string(repository().join("deploy/systemd/capstan.service")).unwrap();
    let example = repository().join("deploy/capstan.toml");
    let exec_lines: Vec<&str> = unit
        .lines()
        .filter_map(|line| line.strip_prefix("ExecStart=").or_else(|| line.strip_prefix("ExecStartPre=")))
        .collect();
    assert_eq!(exec_lines.len(), 2, "{unit}");
    for line in &exec_lines {
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("/usr/local/bin/capstan"));
        let mut args: Vec<String> = words.map(str::to_string).collect();
        for arg in args.iter_mut() {
            if arg == "/etc/capstan/capstan.toml" {
                *arg = example.to_str().unwrap().to_string();
            }
        }
        if !args.iter().any(|a| a == "--check-config") {
            args.push("--check-config".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = capstan(&args, &[]);
        assert!(output.status.success(), "{line}: {}", text(&output.stderr));
    }
    let Ok(analyze) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed here: the unit's syntax is not checked");
        return;
    };
    assert!(analyze.status.success());
    // Verified as installed, with the binary at the path the unit names swapped for this build.
    let dir = tempfile::tempdir().unwrap();
    let installed = unit.replace("/usr/local/bin/capstan", env!("CARGO_BIN_EXE_capstan"));
    let path = write(dir.path(), "capstan.service", &installed);
    let verify = Command::new("systemd-analyze").args(["verify", &path]).output().unwrap();
    let complaints = text(&verify.stderr);
    assert!(verify.status.success(), "{complaints}");
    assert!(
        !complaints.contains("capstan.service"),
        "systemd-analyze has something to say about the unit: {complaints}"
    );
}

/// The container recipe is built where a container engine runs; everywhere, the command it
/// runs is checked by the binary.
#[test]
fn the_container_recipe_runs_a_valid_command_and_builds_where_an_engine_runs() {
    let recipe = std::fs::read_to_string(repository().join("deploy/container/Containerfile")).unwrap();
    assert!(recipe.contains("cargo build --release --locked -p capstan"), "{recipe}");
    assert!(recipe.contains("ENTRYPOINT [\"/usr/local/bin/capstan\"]") && recipe.contains("CMD [\"serve\"]"));
    let dir = tempfile::tempdir().unwrap();
    let recipe_env = [
        ("CAPSTAN_LISTEN", "0.0.0.0:8080"),
        ("CAPSTAN_DATA_DIR", dir.path().to_str().unwrap()),
        ("CAPSTAN_LOG_FORMAT", "json"),
    ];
    // The container listens where other machines reach it: it starts only once the operator
    // chooses authentication (docs/deploy.md), as `docker run -e CAPSTAN_AUTH=token …` does.
    let open_door = capstan(&["serve", "--check-config"], &recipe_env);
    assert_eq!(open_door.status.code(), Some(2));
    assert!(
        text(&open_door.stderr).contains("--allow-unauthenticated-network"),
        "{}",
        text(&open_door.stderr)
    );
    let with_token = [recipe_env.as_slice(), &[("CAPSTAN_AUTH", "token"), ("CAPSTAN_OPERATOR_TOKEN", "t")]].concat();
    let output = capstan(&["serve", "--check-config"], &with_token);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let engine = ["docker", "podman"]
        .into_iter()
        .find(|engine| Command::new(engine).arg("info").output().is_ok_and(|out| out.status.success()));
    let Some(engine) = engine else {
        eprintln!("no running container engine here: the recipe's build is not checked");
        return;
    };
    let built = Command::new(engine)
        .current_dir(repository())
        .args(["build", "-f", "deploy/container/Containerfile", "-t", "capstan-recipe-check", "."])
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", text(&built.stderr));
}

#[test]
fn task_queue_limits_come_from_the_file_as_tables_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "limits.toml",
        "[[task_queue_limits]]\ntask_queue = \"orders\"\nkind = \"activity\"\nmax_leased_tasks = 10\n\
         fairness_key_limits = { max_leased_tasks = 2 }\n\n\
         [[task_queue_limits]]\ntask_queue = \"mail\"\nkind = \"workflow\"\ndispatch_rate_per_second = 5\n",
    );
    let output = capstan(&["serve", "--config", &file, "--check-config"], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (value, source) = settings(&output)["task_queue_limits"].clone();
    assert_eq!(source, "config file");
    assert!(value.contains("orders") && value.contains("mail"), "{value}");
    for (contents, expected) in [
        (
            "[[task_queue_limits]]\nkind = \"activity\"\nmax_leased_tasks = 1\n",
            "`task_queue` is required",
        ),
        (
            "[[task_queue_limits]]\ntask_queue = \"q\"\nkind = \"activity\"\nmax_leased_tasks = 0\n",
            "max_leased_tasks",
        ),
        (
            "[[task_queue_limits]]\ntask_queue = \"q\"\nkind = \"activity\"\nmax_leased = 3\n",
            "unknown field `max_leased`",
        ),
        ("task_queue_limits = 3\n", "must be an object"),
    ] {
        let file = write(dir.path(), "bad-limits.toml", contents);
        let output = capstan(&["serve", "--config", &file, "--check-config"], &[]);
        assert_eq!(output.status.code(), Some(2), "{contents:?} is refused");
        let message = text(&output.stderr);
        assert!(message.contains(expected), "{contents:?}: {message}");
    }
}
