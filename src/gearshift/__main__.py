from gearshift.cli import main

main(prog_name="gearshift")
