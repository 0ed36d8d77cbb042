//! Values built from SQLite rows and kept until a version counter there moves (the synonym table, the filing).

use crate::error::Result;

/// A value built from SQLite rows and kept while a version counter there (moved by triggers or by the writers)
/// stays the same: a search reads the counter, one small query, and rebuilds only after a change made by any
/// process. The version is read before the rows, so a value is never labelled newer than its rows.
///
/// A new version is loaded by a thread of its own, one at a time, while searches keep the value held: a search
/// waits for it at most [`RELOAD_WAIT`] (a small table is then already fresh) and otherwise answers with the value
/// before the change, for as long as the reload takes. Rebuilding in the searches themselves stalled them for
/// seconds after each import of 50,000 synonym groups and after every batch of a 100,000-row filing.
#[derive(Debug)]
pub(crate) struct Versioned<T>(std::sync::Arc<VersionedInner<T>>);

#[derive(Debug)]
pub(crate) struct VersionedInner<T> {
    value: std::sync::RwLock<Option<std::sync::Arc<T>>>,
    /// A reload (or a writer's change, [`Versioned::replace_with`]) is under way.
    busy: std::sync::Mutex<bool>,
    done: std::sync::Condvar,
}

/// How long a search waits for a reload before it answers with the value held.
const RELOAD_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

impl<T> Default for Versioned<T> {
    fn default() -> Self {
        Versioned(std::sync::Arc::new(VersionedInner {
            value: std::sync::RwLock::new(None),
            busy: std::sync::Mutex::new(false),
            done: std::sync::Condvar::new(),
        }))
    }
}

impl<T: Send + Sync + 'static> Versioned<T> {
    fn held(&self) -> Option<std::sync::Arc<T>> {
        self.0.value.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The value of `version`, or while it is being loaded (by another thread) the one held before it.
    pub(crate) fn get(
        &self,
        version: i64,
        version_of: impl Fn(&T) -> i64 + Send + Sync + 'static,
        load: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<std::sync::Arc<T>> {
        let current = self.held();
        if let Some(v) = current.as_ref().filter(|v| version_of(v) >= version) {
            return Ok(v.clone());
        }
        let inner = &self.0;
        let mut busy = inner.busy.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_none() {
            // Nothing to answer with yet: the first caller loads, the others wait for it.
            busy = inner.done.wait_while(busy, |b| *b).unwrap_or_else(|p| p.into_inner());
            if let Some(v) = self.held().filter(|v| version_of(v) >= version) {
                return Ok(v);
            }
            *busy = true;
            drop(busy);
            let loaded = load().map(std::sync::Arc::new);
            if let Ok(v) = &loaded {
                *inner.value.write().unwrap_or_else(|p| p.into_inner()) = Some(v.clone());
            }
            *inner.busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
            inner.done.notify_all();
            return loaded;
        }
        if !*busy {
            *busy = true;
            let shared = std::sync::Arc::clone(inner);
            let spawned = std::thread::Builder::new().name("care-reload".into()).spawn(move || {
                match load() {
                    Ok(v) => {
                        let mut value = shared.value.write().unwrap_or_else(|p| p.into_inner());
                        if value.as_ref().is_none_or(|held| version_of(held) < version_of(&v)) {
                            *value = Some(std::sync::Arc::new(v));
                        }
                    }
                    Err(e) => tracing::warn!("reload failed; searches keep the previous version: {e}"),
                }
                *shared.busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
                shared.done.notify_all();
            });
            if let Err(e) = spawned {
                *busy = false;
                tracing::warn!("cannot start a reload thread: {e}");
            }
        }
        let _ = inner.done.wait_timeout_while(busy, RELOAD_WAIT, |b| *b).unwrap_or_else(|p| p.into_inner());
        Ok(self.held().or(current).expect("a value was held"))
    }

    /// Runs a writer's change with the reload turn held and installs the value it built: searches that see the
    /// new version meanwhile answer with the value held until then, so none of them pays for the rebuild.
    pub(crate) fn replace_with<R>(&self, change: impl FnOnce() -> Result<(T, R)>) -> Result<R> {
        let inner = &self.0;
        {
            let busy = inner.busy.lock().unwrap_or_else(|p| p.into_inner());
            let mut busy = inner.done.wait_while(busy, |b| *b).unwrap_or_else(|p| p.into_inner());
            *busy = true;
        }
        let out = change().map(|(value, out)| {
            *inner.value.write().unwrap_or_else(|p| p.into_inner()) = Some(std::sync::Arc::new(value));
            out
        });
        *inner.busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
        inner.done.notify_all();
        out
    }
}
