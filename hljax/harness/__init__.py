"""Harnesses: the contract, the proposer's edit format, execution reports and proposer prompts."""
