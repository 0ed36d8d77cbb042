use super::*;

#[test]
fn stale_counters_of_unknown_names_are_purged_and_locks_kept() {
    let (_d, s) = store();
    let t = unix_now();
    s.conn()
        .execute_batch(&format!(
            "INSERT INTO login_throttle VALUES ('old', 1, NULL, {old});
             INSERT INTO login_throttle VALUES ('locked', 0, {lock}, {old});
             INSERT INTO login_throttle VALUES ('recent', 2, NULL, {t});",
            old = t - 2 * THROTTLE_KEEP_SECONDS,
            lock = t + 600
        ))
        .unwrap();
    purge_sessions(&s, 3600, 86400).unwrap();
    let left: Vec<String> = s
        .conn()
        .prepare("SELECT name_hash FROM login_throttle ORDER BY name_hash")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<std::result::Result<_, _>>()
        .unwrap();
    assert_eq!(left, vec!["locked".to_string(), "recent".to_string()]);
}

fn current(password: &str) -> CurrentPassword<'_> {
    CurrentPassword { password, policy: LoginPolicy::default(), client: "t" }
}

/// One address failing across many names is refused once its window is full, before any password check and
/// even for a right password; other addresses are not; the refusal is 429 `rate_limited` in Chinese and the
/// failure that filled the window is audited once. Wrong current passwords (a password change) count towards
/// the account's lock and the same address limit.
#[test]
fn one_address_is_limited_across_names_and_current_password_checks_are_throttled() {
    let (_d, s) = store();
    create_user(&s, "system", "admin", "an admin passphrase", Role::Admin, false).unwrap();
    create_user(&s, "admin", "dr.li", "correct horse battery", Role::Clinician, false).unwrap();
    let policy = LoginPolicy { max_failed: 3, address_max_failed: 6, ..LoginPolicy::default() };
    for i in 0..6 {
        let e = authenticate(&s, &format!("guess{i}"), "x", policy, "10.0.0.7", None).unwrap_err();
        assert!(matches!(e, Error::LoginFailed(_)), "attempt {i}: {e:?}");
    }
    let started = std::time::Instant::now();
    let e = authenticate(&s, "dr.li", "correct horse battery", policy, "10.0.0.7", None).unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_millis(20), "a refused address still hashed");
    assert_eq!(e.code(), crate::ErrorCode::RateLimited);
    assert!(e.to_string().contains("此地址的登录失败次数过多"), "{e}");
    assert_eq!(crate::ErrorCode::RateLimited.class(), crate::error::StatusClass::TooManyRequests);
    authenticate(&s, "dr.li", "correct horse battery", policy, "10.0.0.8", None).unwrap();
    let throttled: i64 = s
        .conn()
        .query_row("SELECT COUNT(*) FROM audit WHERE action = 'auth.address_throttled'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(throttled, 1);

    // Current-password checks: three wrong ones lock the account (max_failed 3), and then even the right one
    // is refused; each wrong one is audited without the password.
    let cur = |password| CurrentPassword { password, policy, client: "10.0.0.9" };
    for i in 1..=3 {
        let e =
            set_password(&s, "dr.li", "dr.li", Some(cur("wrong guess")), "a new long passphrase", false).unwrap_err();
        if i < 3 {
            assert_eq!(e.code(), crate::ErrorCode::InvalidInput, "{e:?}");
            assert!(e.to_string().contains("当前密码错误"), "{e}");
        } else {
            assert_eq!(e.code(), crate::ErrorCode::AccountLocked, "{e:?}");
        }
    }
    let e = set_password(&s, "dr.li", "dr.li", Some(cur("correct horse battery")), "a new long passphrase", false)
        .unwrap_err();
    assert_eq!(e.code(), crate::ErrorCode::AccountLocked, "{e:?}");
    let failed: i64 = s
        .conn()
        .query_row(
            "SELECT COUNT(*) FROM audit WHERE action = 'user.password_check_failed' AND instr(detail, 'wrong guess') = 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(failed, 3);
    // The same address limit: three more failures from .9 fill its window of six.
    update_user(&s, "admin", "dr.li", None, None, true).unwrap();
    for _ in 0..3 {
        let _ = authenticate(&s, "nobody", "x", policy, "10.0.0.9", None);
    }
    let e = set_password(&s, "dr.li", "dr.li", Some(cur("correct horse battery")), "a new long passphrase", false)
        .unwrap_err();
    assert_eq!(e.code(), crate::ErrorCode::RateLimited, "{e:?}");
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("care.sqlite")).unwrap();
    (dir, s)
}

#[test]
fn login_lockout_sessions_tokens_and_grants() {
    let (_d, s) = store();
    let pw = bootstrap_admin(&s, "admin", None).unwrap().unwrap();
    assert!(bootstrap_admin(&s, "admin", None).unwrap().is_none(), "bootstrap runs once");
    let policy = LoginPolicy { max_failed: 3, lock_seconds: 600, ..LoginPolicy::default() };
    let admin = authenticate(&s, "admin", &pw, policy, "t", None).unwrap();
    assert!(admin.is_admin());
    assert!(matches!(create_user(&s, "admin", "dr.li", "short", Role::Clinician, false), Err(Error::InvalidInput(_))));
    create_user(&s, "admin", "dr.li", "correct horse battery", Role::Clinician, false).unwrap();
    // Two failures, then success resets the counter.
    for _ in 0..2 {
        assert!(matches!(authenticate(&s, "dr.li", "wrong password", policy, "t", None), Err(Error::LoginFailed(_))));
    }
    authenticate(&s, "dr.li", "correct horse battery", policy, "t", None).unwrap();
    for _ in 0..2 {
        let _ = authenticate(&s, "dr.li", "wrong password", policy, "t", None);
    }
    assert!(matches!(authenticate(&s, "dr.li", "wrong password", policy, "t", None), Err(Error::AccountLocked { .. })));
    // Locked: even the right password is refused until an admin unlocks.
    assert!(matches!(
        authenticate(&s, "dr.li", "correct horse battery", policy, "t", None),
        Err(Error::AccountLocked { .. })
    ));
    update_user(&s, "admin", "dr.li", None, None, true).unwrap();
    let li = authenticate(&s, "dr.li", "correct horse battery", policy, "t", None).unwrap();

    let (cookie, csrf) = create_session(&s, &li).unwrap();
    let sess = session(&s, &cookie, 1800, 43200).unwrap().unwrap();
    assert_eq!(sess.user.username, "dr.li");
    assert_eq!(sess.csrf_token, csrf);
    assert!(session(&s, "forged", 1800, 43200).unwrap().is_none());
    // Idle timeout: pretend the session was last seen an hour ago.
    s.conn().execute("UPDATE sessions SET last_seen = last_seen - 3600", []).unwrap();
    assert!(session(&s, &cookie, 1800, 43200).unwrap().is_none());
    // The cookie value itself is not stored.
    let stored: i64 =
        s.conn().query_row("SELECT COUNT(*) FROM sessions WHERE id_hash = ?1", [&cookie], |r| r.get(0)).unwrap();
    assert_eq!(stored, 0);

    let (tok, secret) = create_token(&s, "admin", "dr.li", "HIS integration").unwrap();
    assert_eq!(token_user(&s, &secret).unwrap().unwrap().username, "dr.li");
    revoke_token(&s, "admin", tok.id).unwrap();
    assert!(token_user(&s, &secret).unwrap().is_none());

    s.create_collection("guidelines", "", "admin").unwrap();
    s.create_collection("private", "", "admin").unwrap();
    assert!(readable_collections(&s, &li).unwrap().is_empty());
    grant(&s, "admin", "dr.li", "guidelines").unwrap();
    assert_eq!(readable_collections(&s, &li).unwrap(), vec!["guidelines"]);
    assert_eq!(readable_collections(&s, &admin).unwrap().len(), 2);
    revoke(&s, "admin", "dr.li", "guidelines").unwrap();
    assert!(granted_collections(&s, li.id).unwrap().is_empty());

    // The last admin cannot be demoted.
    assert!(update_user(&s, "admin", "admin", Some(Role::Clinician), None, false).is_err());
    set_password(&s, "dr.li", "dr.li", Some(current("correct horse battery")), "a new long passphrase", false).unwrap();
    assert!(set_password(&s, "dr.li", "dr.li", Some(current("wrong")), "another long passphrase", false).is_err());
    assert!(audit::verify_full(&s).unwrap().records_checked > 10);
    let c = s.conn();
    let actions: Vec<String> = audit::list(&c, None, None, 100).unwrap().into_iter().map(|r| r.action).collect();
    for a in [
        "auth.login",
        "auth.login_failed",
        "auth.account_locked",
        "permission.grant",
        "token.create",
        "user.password_change",
    ] {
        assert!(actions.iter().any(|x| x == a), "{a} not audited: {actions:?}");
    }
}

/// The finding: 25 concurrent wrong passwords left `failed_logins = 2` and no lock (each attempt read the count
/// before the others wrote it), and the right password then signed in.
#[test]
fn concurrent_wrong_passwords_lock_the_account() {
    let (_d, s) = store();
    create_user(&s, "admin", "dr.li", "correct horse battery", Role::Clinician, false).unwrap();
    let policy = LoginPolicy { max_failed: 5, lock_seconds: 600, ..LoginPolicy::default() };
    std::thread::scope(|sc| {
        for _ in 0..25 {
            sc.spawn(|| {
                let _ = authenticate(&s, "dr.li", "wrong password", policy, "t", None);
            });
        }
    });
    let u = user(&s, "dr.li").unwrap();
    assert!(u.is_locked(unix_now()), "{u:?}");
    assert!(matches!(
        authenticate(&s, "dr.li", "correct horse battery", policy, "t", None),
        Err(Error::AccountLocked { .. })
    ));
    let failures = s
        .conn()
        .query_row("SELECT COUNT(*) FROM audit WHERE action = 'auth.login_failed'", [], |r| r.get::<_, i64>(0))
        .unwrap();
    assert_eq!(failures, 26, "every attempt is audited");
}

/// A stale failed attempt (its password check started before the lock) must not clear the lock, and a right
/// password checked while another attempt locked the account must not sign in.
#[test]
fn a_failure_or_success_racing_a_lock_does_not_undo_it() {
    let (_d, s) = store();
    let u = create_user(&s, "admin", "dr.li", "correct horse battery", Role::Clinician, false).unwrap();
    let policy = LoginPolicy { max_failed: 5, lock_seconds: 600, ..LoginPolicy::default() };
    let later = unix_now() + 600;
    s.conn()
        .execute("UPDATE users SET locked_until = ?1, failed_logins = 0 WHERE id = ?2", params![later, u.id])
        .unwrap();
    let subject = Subject::Account(u.clone(), String::new());
    count_failure(&s, &subject, policy, unix_now()).unwrap();
    assert!(user(&s, "dr.li").unwrap().is_locked(unix_now()), "a failure cleared the lock");
    assert!(matches!(login_succeeded(&s, &u, "dr.li", "t", unix_now()), Err(Error::AccountLocked { .. })));
    assert!(user(&s, "dr.li").unwrap().is_locked(unix_now()));
}

/// Names that are no account are throttled like accounts and not stored; a disabled account answers like a
/// wrong password: the answers do not tell which names exist.
#[test]
fn unknown_and_disabled_names_answer_like_wrong_passwords_and_are_throttled() {
    let (_d, s) = store();
    create_user(&s, "system", "admin", "an admin passphrase", Role::Admin, false).unwrap();
    create_user(&s, "admin", "dr.li", "correct horse battery", Role::Clinician, false).unwrap();
    update_user(&s, "admin", "dr.li", None, Some(true), false).unwrap();
    let policy = LoginPolicy { max_failed: 3, lock_seconds: 600, ..LoginPolicy::default() };
    let disabled = authenticate(&s, "dr.li", "correct horse battery", policy, "t", None).unwrap_err();
    assert!(matches!(disabled, Error::LoginFailed(_)), "{disabled:?}");
    let typed = "my-Secret-passw0rd-typed-as-name";
    for i in 1..=4 {
        let e = authenticate(&s, typed, "x", policy, "t", None).unwrap_err();
        let locked = matches!(e, Error::AccountLocked { .. });
        assert_eq!(locked, i >= 3, "attempt {i}: {e:?}");
    }
    let n: i64 = s
        .conn()
        .query_row("SELECT COUNT(*) FROM audit WHERE instr(detail, ?1) > 0 OR instr(actor, ?1) > 0", [typed], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 0, "the attempted name reached the audit log");
    let long = "x".repeat(200_000);
    assert!(authenticate(&s, &long, "x", policy, "t", None).is_err());
    let longest: i64 =
        s.conn().query_row("SELECT MAX(length(actor) + length(detail)) FROM audit", [], |r| r.get(0)).unwrap();
    assert!(longest < 400, "an audit record of {longest} bytes");
}

/// API tokens end with the password they were created under; the bootstrap password must be changed.
#[test]
fn password_change_revokes_tokens_and_clears_the_forced_change() {
    let (_d, s) = store();
    let pw = bootstrap_admin(&s, "admin", None).unwrap().unwrap();
    assert!(user(&s, "admin").unwrap().must_change_password);
    let (_, secret) = create_token(&s, "admin", "admin", "his").unwrap();
    assert!(token_user(&s, &secret).unwrap().is_some());
    set_password(&s, "admin", "admin", Some(current(&pw)), "a brand new passphrase", false).unwrap();
    assert!(token_user(&s, &secret).unwrap().is_none(), "the token survived the password change");
    assert!(!user(&s, "admin").unwrap().must_change_password);
    let (_d2, s2) = store();
    bootstrap_admin(&s2, "admin", Some("a configured passphrase")).unwrap();
    assert!(!user(&s2, "admin").unwrap().must_change_password, "a configured password is not forced");
}

/// Common, keyboard-walk and pinyin passwords are refused whatever their length, with a Chinese reason; an
/// administrator's password for someone else is temporary.
#[test]
fn weak_passwords_are_refused_and_admin_set_ones_are_temporary() {
    for weak in ["password12", "Aa123456789", "1qaz2wsx3edc", "qwertyuiop", "woaini1314", "zhangsan123", "yiyuan2024"] {
        let e = check_password_strength("dr.li", weak).unwrap_err().to_string();
        assert!(e.contains("太容易被猜中"), "{weak}: {e}");
    }
    assert!(check_password_strength("dr.li", "short").unwrap_err().to_string().contains("至少需要 10 个字符"));
    assert!(check_password_strength("dr.li.ward3", "DR.LI.WARD3").unwrap_err().to_string().contains("用户名"));
    for strong in ["correct horse battery", "病房交班-Kd3#wPq9", "huanghe-qiao-7-deng"] {
        check_password_strength("dr.li", strong).unwrap_or_else(|e| panic!("{strong}: {e}"));
    }
    let (_d, s) = store();
    create_user(&s, "system", "admin", "an admin passphrase", Role::Admin, false).unwrap();
    let u = create_user(&s, "admin", "dr.li", "correct horse battery", Role::Clinician, true).unwrap();
    assert!(u.must_change_password, "a password the admin chose is temporary");
    set_password(&s, "dr.li", "dr.li", Some(current("correct horse battery")), "my own ward passphrase", false)
        .unwrap();
    assert!(!user(&s, "dr.li").unwrap().must_change_password);
    set_password(&s, "admin", "dr.li", None, "reset by the admin 42", false).unwrap();
    assert!(user(&s, "dr.li").unwrap().must_change_password, "an admin's reset is temporary again");
    set_password(&s, "console:root", "dr.li", None, "set on the console 42", true).unwrap();
    assert!(!user(&s, "dr.li").unwrap().must_change_password, "--permanent");
}
