"""The scenarios, side by side over the session: long-prompt (a cold prompt against a decoding
stream and a short chat) and sweep (concurrent decode at several stream counts). Each plays runs
the session gives it and returns raw records."""
