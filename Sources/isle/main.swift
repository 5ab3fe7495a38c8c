import Foundation
import IsleCommandLine

exit(await IsleCLI.run(Array(CommandLine.arguments.dropFirst())))
