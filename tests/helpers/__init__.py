"""Helpers the test tiers share (run builders, spool readers, fault injectors, harnesses);
no tests of their own."""
