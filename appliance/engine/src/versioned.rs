//! Values built from SQLite rows and kept until a version counter there moves (the synonym table, the filing).

use crate::error::Result;

/// A value built from SQLite rows and kept while a version counter there (moved by triggers or by the writers)
/// stays the same: a search reads the counter, one small query, and rebuilds only after a change made by any
/// process. The version is read before the rows, so a value is never labelled newer than its rows.
///
/// A new version is loaded by a thread of its own, one at a time, while searches keep the value held: a search
/// waits for it at most [`RELOAD_WAIT`], and only when the last load took less than that (a small table is then
/// already fresh); otherwise it answers with the value before the change, for as long as the reload takes.
/// Rebuilding in the searches themselves stalled them for seconds after each import of 50,000 synonym groups and
/// after every batch of a 100,000-row filing. Another process's long write moves the version once per batch, so
/// reloads would run back to back and take a core from the searches for the whole write: a reload starts only
/// after a rest of [`REST`] times its duration.
#[derive(Debug)]
pub(crate) struct Versioned<T>(std::sync::Arc<VersionedInner<T>>);

#[derive(Debug)]
pub(crate) struct VersionedInner<T> {
    value: std::sync::RwLock<Option<std::sync::Arc<T>>>,
    turn: std::sync::Mutex<Turn>,
    done: std::sync::Condvar,
}

/// Whose turn it is to load, and what the last load cost.
#[derive(Debug, Default)]
struct Turn {
    busy: Busy,
    /// How long the last load took, and when it ended.
    last: Option<(std::time::Duration, std::time::Instant)>,
}

#[derive(Debug, Default, PartialEq)]
enum Busy {
    #[default]
    Idle,
    /// A thread loads the version a search saw.
    Reloading,
    /// A writer of this process changes the rows and installs the value it builds ([`Versioned::replace_with`]).
    Writing,
}

impl Turn {
    /// Whether a reload may start now: none is under way, and the last one ended at least [`REST`] times its own
    /// duration ago.
    fn may_reload(&self) -> bool {
        self.busy == Busy::Idle && self.last.is_none_or(|(took, ended)| ended.elapsed() >= took * REST)
    }

    /// Whether a search waits for what is under way: only for a reload, and only when the last load took less
    /// than [`RELOAD_WAIT`]. A writer's change is never waited for: the writer installs its value itself.
    fn worth_waiting(&self) -> bool {
        self.busy == Busy::Reloading && self.last.is_none_or(|(took, _)| took < RELOAD_WAIT)
    }
}

/// A reload rests this many times its own duration before the next one starts: reloads take at most a quarter
/// of one core however fast another process moves the version.
const REST: u32 = 3;

/// How long a search waits for a reload before it answers with the value held.
const RELOAD_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

impl<T> Default for Versioned<T> {
    fn default() -> Self {
        Versioned(std::sync::Arc::new(VersionedInner {
            value: std::sync::RwLock::new(None),
            turn: std::sync::Mutex::new(Turn::default()),
            done: std::sync::Condvar::new(),
        }))
    }
}

impl<T: Send + Sync + 'static> VersionedInner<T> {
    /// Puts `value` in the slot. Only the holder of the turn installs, so nothing changes the slot between a
    /// caller's look at it and this. The value it replaces, when nothing else holds it, is freed off this thread,
    /// as a search's last reference is ([`Held`]).
    fn install(&self, value: std::sync::Arc<T>) {
        let replaced = self.value.write().unwrap_or_else(|p| p.into_inner()).replace(value);
        drop(replaced.map(|v| Held(Some(v))));
    }

    /// Gives the turn back and wakes whoever waits for it; a load started at `loaded_since` is remembered with
    /// what it took.
    fn give_back(&self, loaded_since: Option<std::time::Instant>) {
        let mut turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        turn.busy = Busy::Idle;
        if let Some(started) = loaded_since {
            turn.last = Some((started.elapsed(), std::time::Instant::now()));
        }
        drop(turn);
        self.done.notify_all();
    }
}

/// A value of a [`Versioned`] as a search holds it. The last holder of a replaced value is usually a search, which
/// freed it on its way out: 200,000 documents' filing or 50,000 synonym groups, ~100 ms added to that search after
/// every reload. The last holder hands it to a thread of its own to free.
#[derive(Debug)]
pub(crate) struct Held<T: Send + Sync + 'static>(Option<std::sync::Arc<T>>);

impl<T: Send + Sync + 'static> std::ops::Deref for Held<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0.as_deref().expect("held until dropped")
    }
}

impl<T: Send + Sync + 'static> Clone for Held<T> {
    fn clone(&self) -> Self {
        Held(self.0.clone())
    }
}

impl<T: Send + Sync + 'static> Drop for Held<T> {
    fn drop(&mut self) {
        if let Some(last) = self.0.take().and_then(std::sync::Arc::into_inner) {
            // Should no thread start, the value is freed here, as before.
            let _ = std::thread::Builder::new().name("care-retire".into()).spawn(move || {
                crate::priority::lower_this_thread();
                drop(last)
            });
        }
    }
}

impl<T: Send + Sync + 'static> Versioned<T> {
    fn held(&self) -> Option<Held<T>> {
        self.0.value.read().unwrap_or_else(|p| p.into_inner()).clone().map(|v| Held(Some(v)))
    }

    /// Whether a value is held (a search of this process loaded one).
    pub(crate) fn holds_value(&self) -> bool {
        self.0.value.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The value of `version`, or while it is being loaded (by another thread) the one held before it.
    pub(crate) fn get(
        &self,
        version: i64,
        version_of: impl Fn(&T) -> i64 + Send + Sync + 'static,
        load: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<Held<T>> {
        let current = self.held();
        if let Some(v) = current.as_ref().filter(|v| version_of(v) >= version) {
            return Ok(v.clone());
        }
        let inner = &self.0;
        let mut turn = inner.turn.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_none() {
            // Nothing to answer with yet: the first caller loads, the others wait for it.
            turn = inner.done.wait_while(turn, |t| t.busy != Busy::Idle).unwrap_or_else(|p| p.into_inner());
            if let Some(v) = self.held().filter(|v| version_of(v) >= version) {
                return Ok(v);
            }
            turn.busy = Busy::Reloading;
            drop(turn);
            let started = std::time::Instant::now();
            let loaded = load().map(std::sync::Arc::new);
            if let Ok(v) = &loaded {
                inner.install(v.clone());
            }
            inner.give_back(Some(started));
            return loaded.map(|v| Held(Some(v)));
        }
        if turn.may_reload() {
            turn.busy = Busy::Reloading;
            self.reload_in_background(version_of, load, &mut turn);
        }
        if turn.worth_waiting() {
            turn = inner
                .done
                .wait_timeout_while(turn, RELOAD_WAIT, |t| t.busy == Busy::Reloading)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(turn);
        Ok(self.held().or(current).expect("a value was held"))
    }

    /// Starts a thread that loads the new version and installs it unless a newer one was installed meanwhile; the
    /// caller holds the turn, marked busy, which the thread gives back with what the load took.
    fn reload_in_background(
        &self,
        version_of: impl Fn(&T) -> i64 + Send + Sync + 'static,
        load: impl FnOnce() -> Result<T> + Send + 'static,
        turn: &mut Turn,
    ) {
        let shared = std::sync::Arc::clone(&self.0);
        let spawned = std::thread::Builder::new().name("care-reload".into()).spawn(move || {
            // Searches keep the value held meanwhile; the reload takes the CPU they leave.
            crate::priority::lower_this_thread();
            let started = std::time::Instant::now();
            match load() {
                Ok(v) => {
                    let newer = shared
                        .value
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_ref()
                        .is_none_or(|held| version_of(held) < version_of(&v));
                    if newer {
                        shared.install(std::sync::Arc::new(v));
                    }
                }
                Err(e) => tracing::warn!("reload failed; searches keep the previous version: {e}"),
            }
            shared.give_back(Some(started));
        });
        if let Err(e) = spawned {
            turn.busy = Busy::Idle;
            tracing::warn!("cannot start a reload thread: {e}");
        }
    }

    /// Runs a writer's change with the reload turn held and installs the value it built: searches that see the
    /// new version meanwhile answer at once with the value held until then, so none of them pays for the rebuild.
    /// `change` is told whether a value is held at all: where none is (no search ran in this process, as in
    /// `care collection file`), it need build none, and the first search loads the new version.
    pub(crate) fn replace_with<R>(&self, change: impl FnOnce(bool) -> Result<(Option<T>, R)>) -> Result<R> {
        let inner = &self.0;
        {
            let turn = inner.turn.lock().unwrap_or_else(|p| p.into_inner());
            inner.done.wait_while(turn, |t| t.busy != Busy::Idle).unwrap_or_else(|p| p.into_inner()).busy =
                Busy::Writing;
        }
        let out = change(self.holds_value()).map(|(value, out)| {
            if let Some(value) = value {
                inner.install(std::sync::Arc::new(value));
            }
            out
        });
        inner.give_back(None);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_slow_load_is_neither_waited_for_nor_run_back_to_back() {
        let slow = Turn { busy: Busy::Idle, last: Some((Duration::from_millis(400), Instant::now())) };
        assert!(!slow.may_reload(), "a reload must not start right after one that took 400 ms");
        let slow = Turn { busy: Busy::Reloading, ..slow };
        assert!(!slow.worth_waiting(), "a search must not wait for a load known to take longer than it may wait");
        let quick = Turn { busy: Busy::Idle, last: Some((Duration::from_millis(1), Instant::now() - RELOAD_WAIT)) };
        assert!(quick.may_reload());
        assert!(Turn { busy: Busy::Reloading, ..quick }.worth_waiting());
        assert!(!Turn { busy: Busy::Writing, last: None }.worth_waiting(), "a writer installs its own value");
        assert!(Turn::default().may_reload(), "the first reload starts");
    }

    #[test]
    fn searches_keep_the_held_value_while_a_new_version_loads() {
        let v: Versioned<i64> = Versioned::default();
        assert_eq!(*v.get(1, |x| *x, || Ok(1)).unwrap(), 1);
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let held = v.get(
            2,
            |x| *x,
            move || {
                gate.recv().ok();
                Ok(2)
            },
        );
        assert_eq!(*held.unwrap(), 1, "answered with the value held while version 2 loads");
        let unused = || -> Result<i64> { panic!("one reload at a time") };
        assert_eq!(*v.get(2, |x| *x, unused).unwrap(), 1);
        release.send(()).unwrap();
        let turn = v.0.turn.lock().unwrap();
        drop(v.0.done.wait_while(turn, |t| t.busy != Busy::Idle).unwrap());
        assert_eq!(*v.get(2, |x| *x, unused).unwrap(), 2, "the reload's value is installed");
    }

    #[test]
    fn a_writers_change_is_installed_by_the_writer_not_reloaded() {
        let v: std::sync::Arc<Versioned<i64>> = std::sync::Arc::new(Versioned::default());
        assert_eq!(*v.get(1, |x| *x, || Ok(1)).unwrap(), 1);
        let (started, writing) = std::sync::mpsc::channel::<()>();
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let writer = {
            let v = v.clone();
            std::thread::spawn(move || {
                v.replace_with(|held| {
                    started.send(()).unwrap();
                    gate.recv().ok();
                    Ok((held.then_some(2), ()))
                })
            })
        };
        writing.recv().unwrap();
        let unused = || -> Result<i64> { panic!("the writer builds the value; no search reloads it") };
        assert_eq!(*v.get(2, |x| *x, unused).unwrap(), 1, "the value held until the writer is done");
        release.send(()).unwrap();
        writer.join().unwrap().unwrap();
        assert_eq!(*v.get(2, |x| *x, unused).unwrap(), 2);
        let empty: Versioned<i64> = Versioned::default();
        empty.replace_with(|held| Ok((held.then_some(7), ()))).unwrap();
        assert_eq!(*empty.get(3, |x| *x, || Ok(3)).unwrap(), 3, "nothing was held, so nothing was built; 3 is loaded");
    }

    #[test]
    fn the_last_search_holding_a_replaced_value_does_not_free_it() {
        struct Table(i64, std::sync::mpsc::Sender<Option<String>>);
        impl Drop for Table {
            fn drop(&mut self) {
                let _ = self.1.send(std::thread::current().name().map(str::to_string));
            }
        }
        let (freed, on) = std::sync::mpsc::channel();
        let v: Versioned<Table> = Versioned::default();
        let old = v
            .get(1, |t| t.0, {
                let f = freed.clone();
                move || Ok(Table(1, f))
            })
            .unwrap();
        v.replace_with(|held| Ok((held.then(|| Table(2, freed)), ()))).unwrap();
        drop(old);
        let by = on.recv_timeout(Duration::from_secs(10)).expect("the replaced table is freed");
        assert_eq!(by.as_deref(), Some("care-retire"), "freed by a thread of its own, not by the search");
    }
}
