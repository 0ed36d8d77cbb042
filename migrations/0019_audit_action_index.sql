-- Search analytics read a window of one action's records (`action = 'search' AND at >= …`).
CREATE INDEX audit_action_at ON audit(action, at);
