"""The simulator's harness side: scenarios played in virtual time on the engine's real lane host
(engine/scheduler/simulated.py), giving the same raw records a real run gives."""
